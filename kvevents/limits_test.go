package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// handleOnly is a subscriber whose workers never run: handle() queues and
// the test reads the queue.
func handleOnly(t *testing.T, cfg Config, logger *slog.Logger) (*Subscriber, *source, *Metrics) {
	t.Helper()
	m := NewMetrics(nil)
	cfg.Workers = 1
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 64
	}
	s, err := NewSubscriber(cfg, newCollectSink(), m, logger)
	if err != nil {
		t.Fatal(err)
	}
	return s, &source{addr: "test", msgs: m.MessagesReceived.WithLabelValues("connect")}, m
}

func frames(t *testing.T, topic string, seq uint64, b *event.Batch) [][]byte {
	var s8 [8]byte
	binary.BigEndian.PutUint64(s8[:], seq)
	return [][]byte{[]byte(topic), s8[:], payload(t, b)}
}

func drain(s *Subscriber) []*event.Batch {
	var out []*event.Batch
	for {
		it, ok := s.dispatcher.queues[0].pop()
		if !ok {
			return out
		}
		out = append(out, standIn(it))
	}
}

// An equal sequence number is the same batch again: dropped and counted,
// never an engine restart (which would clear the pod). Only a jump back to a
// low value is a restart.
func TestDuplicateAndStaleSeqDoNotClear(t *testing.T) {
	s, src, m := handleOnly(t, Config{}, nil)
	ctx := context.Background()
	for _, seq := range []uint64{100, 100, 101, 60, 102, 3} {
		s.handle(ctx, src, frames(t, "kv@pod-d@m", seq, storedBatch(seq)))
	}
	var got []string
	for _, b := range drain(s) {
		d := ""
		for _, ev := range b.Events {
			d += ev.Kind.String()[:5] + " "
		}
		got = append(got, strings.TrimSpace(d))
	}
	want := "[block block block all_b block]"
	if g := strings.ReplaceAll(strings.Join(got, "|"), "|", " "); "["+g+"]" != want {
		t.Fatalf("queued %q, want %s", got, want)
	}
	if v := metricValue(m.DroppedFrames.WithLabelValues("duplicate_seq")); v != 1 {
		t.Errorf("duplicate_seq drops %v", v)
	}
	if v := metricValue(m.DroppedFrames.WithLabelValues("stale_seq")); v != 1 {
		t.Errorf("stale_seq drops %v", v)
	}
	if v := metricValue(m.Restarts); v != 1 {
		t.Errorf("restarts %v", v)
	}
	for _, tc := range []struct {
		last, seq uint64
		want      string
	}{{5, 5, "duplicate_seq"}, {5, 0, ""}, {5, 4, ""}, {1000, 900, "stale_seq"}, {1000, 499, ""}, {1000, 15, ""}, {0, 0, "duplicate_seq"}} {
		if got := seqVerdict(tc.last, tc.seq); got != tc.want {
			t.Errorf("seqVerdict(%d, %d) = %q, want %q", tc.last, tc.seq, got, tc.want)
		}
	}
}

func TestNamesRejected(t *testing.T) {
	s, src, m := handleOnly(t, Config{}, nil)
	ctx := context.Background()
	long := strings.Repeat("p", MaxPodNameBytes+1)
	for topic, reason := range map[string]string{
		"kv@\xff\xfepod@m":  "pod_name_invalid_utf8",
		"kv@pod\x01x@m":     "pod_name_control_char",
		"kv@" + long + "@m": "pod_name_too_long",
		"kv@pod@m\xc3":      "model_name_invalid_utf8",
		"kv@pod@" + strings.Repeat("m", 1+MaxModelNameBytes): "model_name_too_long",
	} {
		s.handle(ctx, src, frames(t, topic, 0, storedBatch(1)))
		if v := metricValue(m.DroppedFrames.WithLabelValues(reason)); v != 1 {
			t.Errorf("%q: drops{%s} = %v", topic, reason, v)
		}
	}
	// the longest valid names, and non-ASCII UTF-8, pass
	s.handle(ctx, src, frames(t, "kv@"+long[1:]+"@"+strings.Repeat("m", MaxModelNameBytes), 0, storedBatch(1)))
	s.handle(ctx, src, frames(t, "kv@pöd-ü@modèle", 0, storedBatch(1)))
	if n := len(drain(s)); n != 2 {
		t.Fatalf("%d valid batches queued, want 2", n)
	}
	if _, err := NewSubscriber(Config{Endpoints: []EndpointConfig{{Address: "tcp://127.0.0.1:1", Pod: "a\xff"}}},
		newCollectSink(), nil, nil); err == nil {
		t.Fatal("endpoint with an invalid pod name accepted")
	}
}

func TestStreamModelRankLimits(t *testing.T) {
	s, src, m := handleOnly(t, Config{MaxStreams: 2, MaxModels: 1, MaxDPRanks: 2}, nil)
	ctx := context.Background()
	ranked := func(r int) *event.Batch { b := storedBatch(1); b.DPRank = r; return b }
	s.handle(ctx, src, frames(t, "kv@a@m", 0, ranked(0)))
	s.handle(ctx, src, frames(t, "kv@a@m", 0, ranked(1)))
	s.handle(ctx, src, frames(t, "kv@a@m", 0, ranked(2))) // rank limit
	s.handle(ctx, src, frames(t, "kv@b@m", 0, ranked(0))) // stream limit
	s.handle(ctx, src, frames(t, "kv@a@m", 1, ranked(0)))
	s.handle(ctx, src, frames(t, "kv@a@other", 2, ranked(0))) // a's stream would need a second model
	for reason, want := range map[string]float64{"dp_rank_limit": 1, "stream_limit": 1, "model_limit": 1} {
		if v := metricValue(m.DroppedFrames.WithLabelValues(reason)); v != want {
			t.Errorf("drops{%s} = %v, want %v", reason, v, want)
		}
	}
	if n := len(drain(s)); n != 3 {
		t.Fatalf("%d batches queued, want 3", n)
	}
	if v := metricValue(m.limits.streams); v != 2 {
		t.Errorf("streams gauge %v", v)
	}
	if v := metricValue(m.limits.models); v != 1 {
		t.Errorf("models gauge %v", v)
	}
}

// forgetSink records applies and forgets in order.
type forgetSink struct {
	mu  sync.Mutex
	log []string
}

func (f *forgetSink) Apply(_ context.Context, b *event.Batch) event.ApplyOutcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, b.Pod+":"+b.Events[len(b.Events)-1].Kind.String())
	return event.ApplyOutcome{}
}

func (f *forgetSink) ForgetPod(_ context.Context, pod string, _ int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, pod+":forget")
}

func (f *forgetSink) get() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.log, " ")
}

// A silent stream is cleared, then forgotten, in order behind its batches;
// the pod that keeps publishing stays.
func TestPodExpiry(t *testing.T) {
	sink := &forgetSink{}
	m := NewMetrics(nil)
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0", PodExpiry: 300 * time.Millisecond}, sink, m)
	ctx := testCtx(t)
	s.handle(ctx, s.bindSrc, frames(t, "kv@quiet@m", 0, storedBatch(1)))
	quiet := func() string {
		var q []string
		for _, e := range strings.Fields(sink.get()) {
			if strings.HasPrefix(e, "quiet:") {
				q = append(q, e)
			}
		}
		return strings.Join(q, " ")
	}
	for seq := uint64(0); !strings.HasSuffix(quiet(), "forget"); seq++ {
		s.handle(ctx, s.bindSrc, frames(t, "kv@busy@m", seq, storedBatch(seq+10)))
		select {
		case <-ctx.Done():
			t.Fatalf("quiet pod: %q", quiet())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if q := quiet(); q != "quiet:block_stored quiet:all_blocks_cleared quiet:forget" {
		t.Fatalf("quiet pod: %q", q)
	}
	if strings.Contains(sink.get(), "busy:all") || strings.Contains(sink.get(), "busy:forget") {
		t.Fatal("the publishing pod was expired")
	}
	for _, st := range s.Streams() {
		if st.Pod == "quiet" {
			t.Fatalf("expired stream still listed: %+v", st)
		}
	}
	if v := metricValue(m.limits.expired); v != 1 {
		t.Errorf("expired %v", v)
	}
}

// countHandler counts log records.
type countHandler struct {
	mu    sync.Mutex
	lines []string
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b bytes.Buffer
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	h.lines = append(h.lines, b.String())
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// One publisher sending nothing but malformed payloads writes a handful of
// warnings, not one per message; the suppressed ones are counted.
func TestMalformedPublisherLogIsRateLimited(t *testing.T) {
	h := &countHandler{}
	s, src, m := handleOnly(t, Config{}, slog.New(h))
	for i := 0; i < 10000; i++ {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], uint64(i))
		s.handle(context.Background(), src, [][]byte{[]byte("kv@bad@m"), s8[:], {0xc1}})
	}
	h.mu.Lock()
	n := len(h.lines)
	h.mu.Unlock()
	if n > logBurst {
		t.Fatalf("%d warning lines for one source", n)
	}
	if v := metricValue(m.limits.logSuppressed); v != float64(10000-n) {
		t.Fatalf("suppressed %v, want %d", v, 10000-n)
	}
}

func TestLogLimiterRefillAndSummary(t *testing.T) {
	l := newLogLimiter(NewMetrics(nil).limits.logSuppressed)
	now := time.Unix(1000, 0)
	for i := 0; i < logBurst; i++ {
		if ok, _ := l.allow("a", now); !ok {
			t.Fatalf("line %d of the burst refused", i)
		}
	}
	for i := 0; i < 7; i++ {
		if ok, _ := l.allow("a", now); ok {
			t.Fatal("line beyond the burst allowed")
		}
	}
	if ok, _ := l.allow("b", now); !ok {
		t.Fatal("another source was limited by the first")
	}
	ok, n := l.allow("a", now.Add(logEvery))
	if !ok || n != 7 {
		t.Fatalf("after refill: allowed %v, suppressed %d (want 7)", ok, n)
	}
	// keys are bounded: a flood of sources shares one bucket
	for i := 0; i < 3*maxLogKeys; i++ {
		l.allow(strings.Repeat("x", i%50)+string(rune('a'+i%26))+time.Duration(i).String(), now)
	}
	if len(l.buckets) > maxLogKeys+1 {
		t.Fatalf("%d buckets", len(l.buckets))
	}
}

// A payload declaring more array elements than a message may hold is
// rejected before they are allocated.
func TestDecodeElementCap(t *testing.T) {
	n := MaxElementsPerMessage + 1
	p := []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x93}
	p = append(p, 0xac)
	p = append(p, "BlockRemoved"...)
	p = append(p, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	p = append(p, bytes.Repeat([]byte{0x01}, n)...)
	p = append(p, 0xc0)
	var b event.Batch
	_, err := Decode(p, blockkeys.EngineVLLM, &b)
	if !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("err %v", err)
	}
	// one element fewer decodes
	p2 := append([]byte{}, p[:len(p)-n-6]...)
	m := n - 1
	p2 = append(p2, 0xdd, byte(m>>24), byte(m>>16), byte(m>>8), byte(m))
	p2 = append(p2, bytes.Repeat([]byte{0x01}, m)...)
	p2 = append(p2, 0xc0)
	// ... except that the events array and the event itself count too
	if _, err := Decode(p2, blockkeys.EngineVLLM, &b); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("cap counts every array: err %v", err)
	}
}

func TestQueueByteBudget(t *testing.T) {
	s, src, m := handleOnly(t, Config{QueueBytes: 4096}, nil)
	big := make([]uint64, 1000) // ~8 KB: over the budget on its own
	for i := range big {
		big[i] = uint64(i + 1)
	}
	s.handle(context.Background(), src, frames(t, "kv@q@m", 0, storedBatch(big...))) // alone: taken
	s.handle(context.Background(), src, frames(t, "kv@q@m", 1, storedBatch(big...))) // over budget
	if v := metricValue(m.QueueOverflows); v != 1 {
		t.Fatalf("overflows %v", v)
	}
	if q := drain(s); len(q) != 1 {
		t.Fatalf("%d queued", len(q))
	}
}

// Config.Refuse is asked before a batch's stream is admitted: a refused
// batch (the indexer's storage claims) takes no --max-streams slot, so the
// next stream is still admitted.
func TestRefusedBatchTakesNoStream(t *testing.T) {
	s, src, m := handleOnly(t, Config{MaxStreams: 1, Refuse: func(b *event.Batch) bool { return b.Pod == "SHARED_STORAGE" }}, nil)
	ctx := context.Background()
	if s.handle(ctx, src, frames(t, "kv@SHARED_STORAGE@m", 0, storedBatch(1))) {
		t.Error("a refused batch counted as useful (it would earn a bind connection its slot)")
	}
	s.handle(ctx, src, frames(t, "kv@pod-a@m", 0, storedBatch(2)))
	if got := drain(s); len(got) != 1 || got[0].Pod != "pod-a" {
		t.Fatalf("applied %d batches, want pod-a's alone", len(got))
	}
	if n := metricValue(m.DroppedFrames.WithLabelValues("stream_limit")); n != 0 {
		t.Errorf("%v batches dropped at the stream limit", n)
	}
	if n := len(s.Streams()); n != 1 {
		t.Errorf("%d streams, want 1", n)
	}
}
