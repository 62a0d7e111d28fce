package kvevents

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// holdSink blocks its first Apply until release is closed or, when release
// is nil, until Apply's context ends (an index backend that hangs).
type holdSink struct {
	entered chan struct{}
	release chan struct{}

	mu        sync.Mutex
	seqs      []uint64
	cancelled []bool // per applied batch: was Apply's context already done when it returned
}

// ForgetPod: the dispatcher tests queue no forget orders.
func (h *holdSink) ForgetPod(context.Context, string, int) {}

func (h *holdSink) Apply(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	h.mu.Lock()
	first := len(h.seqs) == 0
	h.mu.Unlock()
	if first {
		close(h.entered)
		if h.release != nil {
			<-h.release
		} else {
			<-ctx.Done()
		}
	}
	h.mu.Lock()
	h.seqs = append(h.seqs, b.Seq)
	h.cancelled = append(h.cancelled, ctx.Err() != nil)
	h.mu.Unlock()
	return event.ApplyOutcome{}
}

// runQueued starts a one-worker subscriber, queues n batches of one stream
// (the first is held in Apply by sink), and returns the subscriber, its
// metrics and a stop function that cancels Run, calls during(s) once
// shutdown has begun, and waits for Run to return.
func runQueued(t *testing.T, n int, drain time.Duration, sink *holdSink) (*Subscriber, *Metrics, func(during func())) {
	t.Helper()
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{Workers: 1, QueueSize: n, DrainTimeout: drain}, sink, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	src := &source{addr: "test", msgs: m.MessagesReceived.WithLabelValues("connect")}
	for seq := uint64(0); seq < uint64(n); seq++ {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], seq)
		s.handle(ctx, src, [][]byte{[]byte("kv@pod-d@m"), s8[:], payload(t, storedBatch(seq))})
	}
	select {
	case <-sink.entered:
	case <-time.After(testTimeout):
		t.Fatal("worker never applied a batch")
	}
	return s, m, func(during func()) {
		cancel()
		select {
		case <-s.dispatcher.draining:
		case <-time.After(testTimeout):
			t.Fatal("shutdown never reached the workers")
		}
		during()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(testTimeout):
			t.Fatal("Run did not return")
		}
	}
}

// Batches still queued when the subscriber stops are applied (within the
// drain bound), with a context that is still live.
func TestShutdownDrainsQueuedBatches(t *testing.T) {
	sink := &holdSink{entered: make(chan struct{}), release: make(chan struct{})}
	_, m, stop := runQueued(t, 5, testTimeout, sink)
	stop(func() { close(sink.release) })
	if got := len(sink.seqs); got != 5 {
		t.Fatalf("applied %v, want all 5 queued batches", sink.seqs)
	}
	for i, c := range sink.cancelled {
		if c {
			t.Fatalf("batch %d applied with a cancelled context", sink.seqs[i])
		}
	}
	if v := metricValue(m.ShutdownDropped); v != 0 {
		t.Fatalf("shutdown_dropped = %v", v)
	}
}

// An Apply that hangs (a dead index backend) is cancelled when the drain
// bound expires, or at once without one, and what is still queued is
// dropped and counted instead of holding up shutdown.
func TestShutdownCancelsApplyAndCountsDropped(t *testing.T) {
	for _, drain := range []time.Duration{50 * time.Millisecond, -1} {
		sink := &holdSink{entered: make(chan struct{})}
		_, m, stop := runQueued(t, 5, drain, sink)
		stop(func() {})
		if len(sink.seqs) != 1 || !sink.cancelled[0] {
			t.Fatalf("drain %v: applied %v (cancelled %v), want only the hung batch, cancelled", drain, sink.seqs, sink.cancelled)
		}
		if v := metricValue(m.ShutdownDropped); v != 4 {
			t.Fatalf("drain %v: shutdown_dropped = %v, want 4", drain, v)
		}
	}
}
