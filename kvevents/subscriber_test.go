package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// testTimeout guards every wait: tests never depend on timing, they only
// give up (and fail) if something that must happen never does.
const testTimeout = 30 * time.Second

type collectSink struct {
	mu      sync.Mutex
	batches []*event.Batch
	notify  chan struct{}
	failing map[string]bool // pods whose batches report IndexFailed (fail)
}

func newCollectSink() *collectSink { return &collectSink{notify: make(chan struct{}, 1)} }

// ForgetPod: what a collecting sink holds is the tests' record; it is kept.
func (c *collectSink) ForgetPod(context.Context, string, int) {}

func (c *collectSink) Apply(_ context.Context, b *event.Batch) event.ApplyOutcome {
	c.mu.Lock()
	c.batches = append(c.batches, b)
	o := event.ApplyOutcome{IndexFailed: c.failing[b.Pod]}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return o
}

// fail makes the sink report every later batch of pod as a failed index
// write (true) or a good one (false).
func (c *collectSink) fail(pod string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing == nil {
		c.failing = map[string]bool{}
	}
	c.failing[pod] = on
}

func (c *collectSink) snapshot() []*event.Batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*event.Batch(nil), c.batches...)
}

// waitFor blocks until cond holds over the batches received so far.
func (c *collectSink) waitFor(t *testing.T, what string, cond func([]*event.Batch) bool) []*event.Batch {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		bs := c.snapshot()
		if cond(bs) {
			return bs
		}
		select {
		case <-c.notify:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; got %d batches: %s", what, len(bs), describe(bs))
		}
	}
}

func describe(bs []*event.Batch) string {
	s := ""
	for _, b := range bs {
		s += fmt.Sprintf("[%s/%d seq=%d", b.Pod, b.DPRank, b.Seq)
		for _, e := range b.Events {
			s += " " + e.Kind.String()
		}
		s += "] "
	}
	return s
}

func hasSeq(pod string, seq uint64) func([]*event.Batch) bool {
	return func(bs []*event.Batch) bool {
		for _, b := range bs {
			if b.Pod == pod && b.Seq == seq {
				return true
			}
		}
		return false
	}
}

func storedBatch(hashes ...uint64) *event.Batch {
	toks := make([]uint32, len(hashes))
	return &event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: 1}}}
}

func payload(t *testing.T, b *event.Batch) []byte {
	t.Helper()
	p, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// storedPayloads encodes the batches of seqs 0 to n-1, seq s storing block
// base+s, keyed by seq.
func storedPayloads(t *testing.T, n int, base uint64) map[uint64][]byte {
	t.Helper()
	p := make(map[uint64][]byte, n)
	for seq := range uint64(n) {
		p[seq] = payload(t, storedBatch(seq+base))
	}
	return p
}

// seqsOf lists the batches' sequence numbers in order.
func seqsOf(bs []*event.Batch) []uint64 {
	var out []uint64
	for _, b := range bs {
		out = append(out, b.Seq)
	}
	return out
}

// startPub runs an engine publisher on addr (bind: listen there, else
// connect to it) until the test ends.
func startPub(t *testing.T, addr string, bind bool) *enginepub.Publisher {
	t.Helper()
	pub, err := enginepub.NewPublisher(addr, bind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return pub
}

// startSub runs a subscriber until the test ends.
// startCollecting starts a subscriber bound on loopback with a collecting
// sink and a publisher connected to it; send publishes b as pod's batch seq
// (model "m") and returns once the sink has it.
func startCollecting(t *testing.T) (*Subscriber, *collectSink, func(pod string, seq uint64, b *event.Batch)) {
	t.Helper()
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, nil)
	pub := startPub(t, s.BindAddr(), false)
	if err := pub.WaitSubscribed(testCtx(t), "kv@"); err != nil {
		t.Fatal(err)
	}
	send := func(pod string, seq uint64, b *event.Batch) {
		t.Helper()
		if err := pub.Publish("kv@"+pod+"@m", seq, payload(t, b)); err != nil {
			t.Fatal(err)
		}
		sink.waitFor(t, pod, hasSeq(pod, seq))
	}
	return s, sink, send
}

func startSub(t *testing.T, cfg Config, sink event.Sink, m *Metrics) *Subscriber {
	t.Helper()
	return startSubLogger(t, cfg, sink, m, nil)
}

// startSubLogger is startSub with the subscriber logging to log (nil:
// NewSubscriber's default).
func startSubLogger(t *testing.T, cfg Config, sink event.Sink, m *Metrics, log *slog.Logger) *Subscriber {
	t.Helper()
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin, cfg.ReconnectMax = 20*time.Millisecond, 200*time.Millisecond
	}
	s, err := NewSubscriber(cfg, sink, m, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(testTimeout):
			t.Error("Run did not return")
		}
	})
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// Central topology: our SUB binds, the engine's PUB connects.
func TestBindTopologyAndFrames(t *testing.T) {
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Workers: 2}, sink, m)
	pub := startPub(t, s.BindAddr(), false)
	if err := pub.WaitSubscribed(testCtx(t), "kv@"); err != nil {
		t.Fatal(err)
	}
	var seq8 [8]byte
	// malformed messages first: all dropped and counted
	pub.SendFrames([]byte("kv@pod-a@m"), seq8[:])                          // 2 frames
	pub.SendFrames([]byte("kv@pod-a@m"), seq8[:], []byte{0x90}, []byte{1}) // 4 frames
	pub.SendFrames([]byte("kv@pod-a@m"), seq8[:7], payload(t, storedBatch(1)))
	pub.Publish("kv@", 0, payload(t, storedBatch(1)))                  // no pod
	pub.Publish("kv@pod-a@m", 0, []byte{0xc1})                         // malformed batch
	pub.Publish("kv@pod-a@org/model-x", 0, payload(t, storedBatch(1))) // good
	pub.Publish("kv@pod-a@org/model-x", 1, payload(t, storedBatch(2)))
	bs := sink.waitFor(t, "seq 1", hasSeq("pod-a", 1))
	if len(bs) != 2 || bs[0].Seq != 0 || bs[0].Model != "org/model-x" || bs[0].Events[0].BlockHashes[0] != 1 {
		t.Fatalf("got %s", describe(bs))
	}
	for reason, want := range map[string]float64{"frame_count": 2, "seq_length": 1, "no_pod": 1} {
		if got := metricValue(m.DroppedFrames.WithLabelValues(reason)); got != want {
			t.Errorf("dropped %s = %v, want %v", reason, got, want)
		}
	}
	if got := metricValue(m.DecodeErrors.WithLabelValues("vllm", "batch")); got != 1 {
		t.Errorf("batch decode errors = %v", got)
	}
	if got := metricValue(m.MessagesReceived.WithLabelValues("bind")); got != 7 {
		t.Errorf("messages = %v", got)
	}
	eps := s.Endpoints()
	if len(eps) != 1 || !eps[0].Bound {
		t.Fatalf("endpoints %+v", eps)
	}
}

// Sequence tracking through the real socket path: gap, restart, and the
// synthetic clear delivered in order before the restarted stream's batch.
func TestSeqGapAndRestart(t *testing.T) {
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, m)
	pub := startPub(t, s.BindAddr(), false)
	pub.WaitSubscribed(testCtx(t), "kv@")
	for _, seq := range []uint64{0, 1, 5, 2} {
		b := storedBatch(seq + 100)
		b.DPRank = 1
		pub.Publish("kv@pod-s@m", seq, payload(t, b))
	}
	// a second DP rank of the same pod is its own stream
	pub.Publish("kv@pod-s@m", 9, payload(t, storedBatch(7)))
	bs := sink.waitFor(t, "all", func(bs []*event.Batch) bool { return len(bs) == 5 })
	var rank1 []*event.Batch
	for _, b := range bs {
		if b.DPRank == 1 {
			rank1 = append(rank1, b)
		}
	}
	last := rank1[3]
	if last.Seq != 2 || len(last.Events) != 2 || last.Events[0].Kind != event.AllBlocksCleared || last.Events[1].BlockHashes[0] != 102 {
		t.Fatalf("restart batch %s", describe([]*event.Batch{last}))
	}
	st := s.Streams()
	if len(st) != 2 {
		t.Fatalf("streams %+v", st)
	}
	r0, r1 := st[0], st[1]
	if r0.DPRank != 0 || r0.Batches != 1 || r0.SeqGaps != 0 || r0.Restarts != 0 {
		t.Errorf("rank 0 %+v", r0)
	}
	if r1.DPRank != 1 || r1.Batches != 4 || r1.SeqGaps != 1 || r1.MissedBatches != 3 || r1.Restarts != 1 || r1.LastSeq != 2 {
		t.Errorf("rank 1 %+v", r1)
	}
	if metricValue(m.SeqGaps) != 1 || metricValue(m.MissedBatches) != 3 || metricValue(m.Restarts) != 1 {
		t.Errorf("metrics gaps=%v missed=%v restarts=%v", metricValue(m.SeqGaps), metricValue(m.MissedBatches), metricValue(m.Restarts))
	}
}

// Overflow is driven through handle() without running workers, so the queue
// fills deterministically; the reader's wait for room is kept short.
func TestQueueOverflowClearsBeforeNextBatch(t *testing.T) {
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{Workers: 1, QueueSize: 1, QueueWait: 10 * time.Millisecond}, newCollectSink(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &source{addr: "test", msgs: m.MessagesReceived.WithLabelValues("connect")}
	msg := func(seq uint64, h uint64) [][]byte {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], seq)
		return [][]byte{[]byte("kv@pod-o@m"), s8[:], payload(t, storedBatch(h))}
	}
	ctx := context.Background()
	s.handle(ctx, src, msg(0, 10))
	s.handle(ctx, src, msg(1, 11)) // queue full: dropped
	s.handle(ctx, src, msg(2, 12)) // still full: dropped
	if got := metricValue(m.QueueOverflows); got != 2 {
		t.Fatalf("overflows %v", got)
	}
	q := s.dispatcher.queues[0]
	if b := next(t, q).batch; b.Seq != 0 || len(b.Events) != 1 {
		t.Fatalf("first %s", describe([]*event.Batch{b}))
	}
	s.handle(ctx, src, msg(3, 13))
	b := next(t, q).batch
	if b.Seq != 3 || len(b.Events) != 2 || b.Events[0].Kind != event.AllBlocksCleared || b.Events[1].BlockHashes[0] != 13 {
		t.Fatalf("after overflow %s", describe([]*event.Batch{b}))
	}
	s.handle(ctx, src, msg(4, 14))
	if b := next(t, q).batch; len(b.Events) != 1 {
		t.Fatalf("clear delivered twice: %s", describe([]*event.Batch{b}))
	}
	st := s.Streams()[0]
	if st.Overflows != 2 || st.SeqGaps != 0 {
		t.Fatalf("stream %+v", st)
	}
	if got := metricValue(m.SyntheticClears.WithLabelValues("overflow")); got != 1 {
		t.Fatalf("synthetic clears %v", got)
	}
}

// Per-pod topology: the engine binds, we connect; endpoints come and go at
// runtime, and removing one clears its pods.
func TestConnectTopologyAddRemoveEndpoint(t *testing.T) {
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{}, sink, m)
	pubA := startPub(t, "tcp://127.0.0.1:0", true)
	pubB := startPub(t, "tcp://127.0.0.1:0", true)
	if err := s.AddEndpoint(EndpointConfig{Address: pubA.Addr()}); err != nil {
		t.Fatal(err)
	}
	// B declares pod and model: they override the topic; SGLang engine.
	if err := s.AddEndpoint(EndpointConfig{Address: pubB.Addr(), Pod: "pod-b", Model: "mb", Engine: blockkeys.EngineSGLang}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEndpoint(EndpointConfig{Address: pubB.Addr()}); err == nil {
		t.Fatal("duplicate endpoint accepted")
	}
	ctx := testCtx(t)
	pubA.WaitSubscribed(ctx, "kv@")
	pubB.WaitSubscribed(ctx, "kv@")
	pubA.Publish("kv@pod-a@ma", 0, payload(t, storedBatch(1)))
	sg, _ := enginepub.EncodeSGLangBatch(storedBatch(0xffffffffffffffff))
	pubB.Publish("kv@ignored@ignored", 0, sg)
	bs := sink.waitFor(t, "both pods", func(bs []*event.Batch) bool { return hasSeq("pod-a", 0)(bs) && hasSeq("pod-b", 0)(bs) })
	for _, b := range bs {
		if b.Pod == "pod-b" && (b.Model != "mb" || b.Engine != blockkeys.EngineSGLang || b.Events[0].BlockHashes[0] != 0xffffffffffffffff) {
			t.Fatalf("pod-b batch %+v", b)
		}
	}
	eps := s.Endpoints()
	if len(eps) != 2 || !eps[0].Connected || !eps[1].Connected || eps[1].Pod != "pod-b" {
		t.Fatalf("endpoints %+v", eps)
	}
	if got := metricValue(m.ConnectedEndpoints); got != 2 {
		t.Fatalf("connected gauge %v", got)
	}
	if err := s.RemoveEndpoint(pubB.Addr()); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "clear for pod-b", func(bs []*event.Batch) bool {
		b := bs[len(bs)-1]
		return b.Pod == "pod-b" && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared
	})
	for _, st := range s.Streams() {
		if st.Pod == "pod-b" {
			t.Fatalf("stream of removed endpoint still listed: %+v", st)
		}
	}
	if eps := s.Endpoints(); len(eps) != 1 || eps[0].Address != pubA.Addr() {
		t.Fatalf("endpoints after removal %+v", eps)
	}
	if err := s.RemoveEndpoint(pubB.Addr()); err == nil {
		t.Fatal("removing an unknown endpoint succeeded")
	}
	if got := metricValue(m.ConnectedEndpoints); got != 1 {
		t.Fatalf("connected gauge after removal %v", got)
	}
}

// A pod restarts: its publisher goes away, we reconnect with backoff, and
// the restarted engine's seq 0 clears the pod.
func TestReconnectAfterPublisherRestart(t *testing.T) {
	sink := newCollectSink()
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pub, err := enginepub.NewPublisher(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	s := startSub(t, Config{Endpoints: []EndpointConfig{{Address: addr}}}, sink, nil)
	ctx := testCtx(t)
	pub.WaitSubscribed(ctx, "kv@")
	pub.Publish("kv@pod-r@m", 0, payload(t, storedBatch(1)))
	pub.Publish("kv@pod-r@m", 1, payload(t, storedBatch(2)))
	sink.waitFor(t, "seq 1", hasSeq("pod-r", 1))
	pub.Close()

	// the new process binds the same port (retry while the old listener
	// is being torn down)
	var pub2 *enginepub.Publisher
	for pub2 == nil {
		if pub2, err = enginepub.NewPublisher(addr, true); err != nil {
			select {
			case <-ctx.Done():
				t.Fatal(err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	defer pub2.Close()
	if err := pub2.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	pub2.Publish("kv@pod-r@m", 0, payload(t, storedBatch(3)))
	bs := sink.waitFor(t, "post-restart batch", func(bs []*event.Batch) bool { return len(bs) == 3 })
	b := bs[2]
	if b.Seq != 0 || b.Events[0].Kind != event.AllBlocksCleared || b.Events[1].BlockHashes[0] != 3 {
		t.Fatalf("after restart %s", describe(bs))
	}
	if st := s.Streams(); len(st) != 1 || st[0].Restarts != 1 {
		t.Fatalf("streams %+v", st)
	}
	if eps := s.Endpoints(); !eps[0].Connected {
		t.Fatalf("endpoint not connected again: %+v", eps)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := NewSubscriber(Config{Endpoints: []EndpointConfig{{Address: "nowhere"}}}, newCollectSink(), nil, nil); err == nil {
		t.Fatal("address without transport accepted")
	}
	for _, replay := range []string{"tcp://", "inproc://x", "10.0.0.7:5558"} {
		ep := EndpointConfig{Address: "tcp://127.0.0.1:1", ReplayAddress: replay}
		if _, err := NewSubscriber(Config{Endpoints: []EndpointConfig{ep}}, newCollectSink(), nil, nil); err == nil {
			t.Fatalf("replay address %q accepted", replay)
		}
	}
	// An endpoint's declared DP rank (EndpointConfig.DPRank) is a rank like
	// any batch's: 0..--max-dp-ranks-1.
	for _, rank := range []int{-1, DefaultMaxDPRanks} {
		ep := EndpointConfig{Address: "tcp://127.0.0.1:1", DPRank: rank}
		if _, err := NewSubscriber(Config{Endpoints: []EndpointConfig{ep}}, newCollectSink(), nil, nil); err == nil {
			t.Fatalf("dp_rank %d accepted", rank)
		}
	}
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, newCollectSink(), nil)
	if _, err := NewSubscriber(Config{Bind: s.BindAddr()}, newCollectSink(), nil, nil); err == nil {
		t.Fatal("second bind on the same port accepted")
	}
}

// metricValue reads one counter or gauge (without pulling in testutil).
func metricValue(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var d dto.Metric
	if err := (<-ch).Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// vLLM's default topic is "": with AllTopics and an endpoint that names its
// pod, such a stream is accepted; under the default filter a foreign topic
// is dropped and counted.
func TestTopicFilter(t *testing.T) {
	sink := newCollectSink()
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	startSub(t, Config{AllTopics: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), Pod: "pod-x", Model: "mx"}}}, sink, nil)
	pub.WaitSubscribed(testCtx(t), "")
	pub.Publish("", 0, payload(t, storedBatch(1)))
	bs := sink.waitFor(t, "pod-x", hasSeq("pod-x", 0))
	if bs[0].Model != "mx" {
		t.Fatalf("got %+v", bs[0])
	}

	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{}, newCollectSink(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	var s8 [8]byte
	s.handle(context.Background(), &source{addr: "x", msgs: m.MessagesReceived.WithLabelValues("connect")},
		[][]byte{[]byte("other@pod@m"), s8[:], payload(t, storedBatch(1))})
	if v := metricValue(m.DroppedFrames.WithLabelValues("topic_filter")); v != 1 {
		t.Fatalf("topic_filter drops = %v", v)
	}
}

// Close releases the bind socket of a Subscriber that never ran, makes a
// running one return, and Run after Close refuses to start.
func TestCloseReleasesBindSocket(t *testing.T) {
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	s, err := NewSubscriber(Config{Bind: addr}, newCollectSink(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close() // idempotent
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("Run after Close started")
	}
	s2, err := NewSubscriber(Config{Bind: addr}, newCollectSink(), nil, nil)
	if err != nil {
		t.Fatalf("rebinding after Close: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s2.Run(context.Background()) }()
	for running := false; !running; {
		s2.mu.Lock()
		running = s2.running
		s2.mu.Unlock()
		runtime.Gosched()
	}
	s2.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Run did not return after Close")
	}
}
