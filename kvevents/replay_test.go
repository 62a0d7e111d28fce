package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// serveReplay answers vLLM replay requests (>= 0.26 format) from buf on a
// pure-Go ROUTER bound to endpoint until ctx ends; it returns the address
// to connect to.
func serveReplay(t *testing.T, ctx context.Context, endpoint, topic string, buf map[uint64][]byte, order []uint64) string {
	t.Helper()
	router, err := zmtp.ListenRouter(endpoint, zmtp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	// topic "" serves the layout without a topic frame (vLLM <= 0.25, SGLang)
	send := func(id, seq, payload []byte) {
		if topic == "" {
			router.Send(ctx, id, nil, seq, payload)
		} else {
			router.Send(ctx, id, nil, []byte(topic), seq, payload)
		}
	}
	go func() {
		for {
			msg, err := router.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for _, seq := range order {
				if seq >= start {
					var s8 [8]byte
					binary.BigEndian.PutUint64(s8[:], seq)
					send(id, s8[:], buf[seq])
				}
			}
			send(id, endSeq[:], nil)
		}
	}()
	if strings.HasPrefix(endpoint, "tcp://") {
		return "tcp://" + router.Addr().String()
	}
	return endpoint
}

func TestReplayPartialAndUnreachable(t *testing.T) {
	const topic = "kv@pod-g@m"
	for _, tc := range []struct {
		name       string
		serve      bool
		listen     string
		wantSeqs   []uint64
		wantResult string
		replayed   uint64
	}{
		// the engine's buffer no longer has seq 2: seq 1 is recovered, the
		// gap is reported as partial, and the live batch still applies
		{"partial", true, "tcp://127.0.0.1:0", []uint64{0, 1, 3}, "partial", 1},
		// vLLM's replay endpoint may be a unix socket
		{"partial_ipc", true, "ipc://" + filepath.Join(t.TempDir(), "replay.sock"), []uint64{0, 1, 3}, "partial", 1},
		{"unreachable", false, "", []uint64{0, 3}, "error", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pub := startPub(t, "tcp://127.0.0.1:0", true)
			p := storedPayloads(t, 4, 50)
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			if tc.serve {
				replay = serveReplay(t, ctx, tc.listen, topic, p, []uint64{1, 3})
			}
			sink := newCollectSink()
			m := NewMetrics(nil)
			s := startSub(t, Config{DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
			pub.WaitSubscribed(ctx, topic)
			pub.Publish(topic, 0, p[0])
			pub.Publish(topic, 3, p[3])
			bs := sink.waitFor(t, "seq 3", hasSeq("pod-g", 3))
			var got []uint64
			for _, b := range bs {
				got = append(got, b.Seq)
				if b.Events[0].Kind != event.BlockStored || b.Events[0].BlockHashes[0] != b.Seq+50 {
					t.Fatalf("batch %s", describe([]*event.Batch{b}))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantSeqs) {
				t.Fatalf("seqs %v, want %v", got, tc.wantSeqs)
			}
			if v := metricValue(m.Replays.WithLabelValues(tc.wantResult)); v != 1 {
				t.Fatalf("replays{%s} = %v", tc.wantResult, v)
			}
			if st := s.Streams()[0]; st.MissedBatches != 2 || st.ReplayedBatches != tc.replayed {
				t.Fatalf("stream %+v", st)
			}
		})
	}
}

// slowReplay is a replay ROUTER that reports each request on requested and
// answers it (seqs 1 and 2, then the end marker) only once release is
// closed: an engine whose replay socket is slow.
func slowReplay(t *testing.T, ctx context.Context, topic string, p map[uint64][]byte) (addr string, requested chan struct{}, release chan struct{}) {
	t.Helper()
	router, err := zmtp.ListenRouter("tcp://127.0.0.1:0", zmtp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	requested, release = make(chan struct{}, 1), make(chan struct{})
	go func() {
		msg, err := router.Recv(ctx)
		if err != nil || len(msg.Frames) != 3 {
			return
		}
		requested <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return
		}
		id := msg.Frames[0]
		for _, seq := range []uint64{1, 2} {
			var s8 [8]byte
			binary.BigEndian.PutUint64(s8[:], seq)
			router.Send(ctx, id, nil, []byte(topic), s8[:], p[seq])
		}
		router.Send(ctx, id, nil, []byte(topic), endSeq[:], nil)
	}()
	return "tcp://" + router.Addr().String(), requested, release
}

// A snapshot (what /v1/pods and every metrics scrape take) must not wait for
// a replay exchange in progress: the replay socket here answers only after
// the snapshot returned, with a replay timeout far longer than the bound.
func TestStreamsAnswerDuringSlowReplay(t *testing.T) {
	const topic = "kv@pod-slow@m"
	ctx := testCtx(t)
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	p := storedPayloads(t, 4, 50)
	replay, requested, release := slowReplay(t, ctx, topic, p)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	sink := newCollectSink()
	s := startSub(t, Config{ReplayTimeout: 5 * time.Second,
		DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, nil)
	pub.WaitSubscribed(ctx, topic)
	pub.Publish(topic, 0, p[0])
	pub.Publish(topic, 3, p[3])
	select {
	case <-requested:
	case <-ctx.Done():
		t.Fatal("no replay request")
	}
	snap := make(chan []StreamStats, 1)
	go func() { snap <- s.Streams() }()
	select {
	case st := <-snap:
		if len(st) != 1 || st[0].MissedBatches != 2 || !st[0].Replaying || st[0].LastSeq != 0 {
			t.Fatalf("streams during replay %+v", st)
		}
	case <-time.After(time.Second):
		t.Fatal("Streams() blocked while a replay was in progress")
	}
	close(release)
	released = true
	bs := sink.waitFor(t, "seq 3", hasSeq("pod-slow", 3))
	got := seqsOf(bs)
	if fmt.Sprint(got) != "[0 1 2 3]" {
		t.Fatalf("seqs %v, want the replayed batches before the live one", got)
	}
	if st := s.Streams(); st[0].ReplayedBatches != 2 || st[0].Replaying || st[0].LastSeq != 3 {
		t.Fatalf("stream %+v", st[0])
	}
}

// A replay peer that accepts the connection but never speaks ZMTP must not
// hold the stream beyond the replay timeout: the live batch still applies.
func TestReplayStalledPeerTimesOut(t *testing.T) {
	const topic = "kv@pod-stall@m"
	ctx := testCtx(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never written to
		}
	}()
	defer func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{ReplayTimeout: 200 * time.Millisecond,
		DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: "tcp://" + ln.Addr().String()}}}, sink, m)
	pub.WaitSubscribed(ctx, topic)
	pub.Publish(topic, 0, payload(t, storedBatch(50)))
	pub.Publish(topic, 3, payload(t, storedBatch(53)))
	bs := sink.waitFor(t, "seq 3", hasSeq("pod-stall", 3))
	if len(bs) != 2 {
		t.Fatalf("got %s", describe(bs))
	}
	if v := metricValue(m.Replays.WithLabelValues("error")); v != 1 {
		t.Fatalf("replays{error} = %v", v)
	}
	if st := s.Streams(); st[0].MissedBatches != 2 || st[0].ReplayedBatches != 0 {
		t.Fatalf("stream %+v", st[0])
	}
}

// Removing an endpoint abandons its replay in progress: RemoveEndpoint waits
// for the endpoint's reader, which must not sit out the replay timeout.
func TestRemoveEndpointAbandonsReplay(t *testing.T) {
	const topic = "kv@pod-rm@m"
	ctx := testCtx(t)
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	p := map[uint64][]byte{0: payload(t, storedBatch(50)), 3: payload(t, storedBatch(53))}
	replay, requested, release := slowReplay(t, ctx, topic, p)
	defer close(release)
	sink := newCollectSink()
	m := NewMetrics(nil)
	// far longer than the test's own deadline: only cancellation can end it
	s := startSub(t, Config{ReplayTimeout: 10 * testTimeout,
		DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
	pub.WaitSubscribed(ctx, topic)
	pub.Publish(topic, 0, p[0])
	pub.Publish(topic, 3, p[3])
	select {
	case <-requested:
	case <-ctx.Done():
		t.Fatal("no replay request")
	}
	removed := make(chan error, 1)
	go func() { removed <- s.RemoveEndpoint(pub.Addr()) }()
	select {
	case err := <-removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("RemoveEndpoint waited for the replay exchange")
	}
	bs := sink.waitFor(t, "clear for pod-rm", func(bs []*event.Batch) bool {
		b := bs[len(bs)-1]
		return b.Pod == "pod-rm" && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared
	})
	if hasSeq("pod-rm", 3)(bs) {
		t.Fatalf("the live batch behind an abandoned replay was applied: %s", describe(bs))
	}
	if v := metricValue(m.Replays.WithLabelValues("error")); v != 1 {
		t.Fatalf("replays{error} = %v", v)
	}
}

// At connect the subscriber asks the replay socket for its buffer: a daemon
// started after the engine published serves it before its next event. Live
// copies of what the catch-up delivered are dropped, newer ones apply.
func TestCatchUpAtConnect(t *testing.T) {
	const topic = "kv@pod-c@m"
	ctx := testCtx(t)
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	p := storedPayloads(t, 4, 70)
	replay := serveReplay(t, ctx, "tcp://127.0.0.1:0", topic, p, []uint64{0, 1, 2})
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
	bs := sink.waitFor(t, "caught up to seq 2", hasSeq("pod-c", 2))
	if len(bs) != 3 || bs[0].Seq != 0 || bs[2].Seq != 2 {
		t.Fatalf("catch-up: %s", describe(bs))
	}
	st := s.Streams()[0]
	if !st.Complete || st.CompleteSinceSeq != 0 || st.LastSeq != 2 || st.Endpoint != pub.Addr() {
		t.Fatalf("stream %+v", st)
	}
	if err := pub.WaitSubscribed(ctx, topic); err != nil {
		t.Fatal(err)
	}
	pub.Publish(topic, 2, p[2]) // the live copy of a caught-up batch
	pub.Publish(topic, 3, p[3])
	bs = sink.waitFor(t, "seq 3", hasSeq("pod-c", 3))
	if len(bs) != 4 || bs[3].Seq != 3 || len(bs[3].Events) != 1 {
		t.Fatalf("after catch-up: %s", describe(bs))
	}
	if st := s.Streams()[0]; st.Restarts != 0 || !st.Complete || metricValue(m.DroppedFrames.WithLabelValues("duplicate")) != 1 {
		t.Fatalf("duplicate live batch mistaken for a restart: %+v", st)
	}
	// counted once the exchange ended, which was before live reading began
	if metricValue(m.CatchUps.WithLabelValues("ok")) != 1 || metricValue(m.CaughtUpBatches) != 3 || metricValue(m.ReplayedBatches) != 0 {
		t.Fatal("catch-up metrics")
	}
}
