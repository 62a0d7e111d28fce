package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// The sink's outcome is the pod's trust: a failed write holds the pod (not
// servable) and marks its stream incomplete ("index_error"); the recovery
// loop queues a clear for the quiet pod, and once the sink reports the
// clear went through the pod is served again, still incomplete. Other pods
// are untouched.
func TestApplyOutcomeHoldsThePodUntilCleared(t *testing.T) {
	s, sink, send := startCollecting(t)
	send("good", 0, storedBatch(1))
	send("bad", 0, storedBatch(2))
	if !s.Servable("bad", 0) || !s.Servable("nobody", 0) {
		t.Fatal("a pod is held before any failure")
	}
	sink.fail("bad", true)
	send("bad", 1, storedBatch(3))
	st := waitStream(t, s, "bad", "the failed write recorded", func(st StreamStats) bool { return st.Held == "index_error" })
	if st.Complete || st.IncompleteReason != "index_error" || s.Servable("bad", 0) {
		t.Fatalf("bad after its failed write: %+v servable %v", st, s.Servable("bad", 0))
	}
	if !s.Servable("good", 0) {
		t.Fatal("good held by bad's failure")
	}
	states := make([]StreamState, 2)
	s.StreamStates([]StreamRef{{"bad", 0}, {"good", 0}}, states)
	if states[0].Servable() || !states[1].Servable() || states[0].Held != "index_error" || states[0].IncompleteReason != "index_error" {
		t.Fatalf("StreamStates: %+v", states)
	}

	// The index is back: the recovery clear goes through and serves the pod
	// again; only a rebuild or the engine's clear makes it complete.
	sink.fail("bad", false)
	waitStream(t, s, "bad", "the quiet pod recovered", func(st StreamStats) bool { return st.Held == "" })
	if !s.Servable("bad", 0) {
		t.Fatal("bad not servable after its clear")
	}
	var cleared bool
	for _, b := range sink.snapshot() {
		if b.Pod == "bad" && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared && b.Model == "m" {
			cleared = true
		}
	}
	if !cleared {
		t.Fatal("no recovery clear reached the sink")
	}
	if st := waitStream(t, s, "bad", "bad listed", func(StreamStats) bool { return true }); st.Complete || st.IncompleteReason != "index_error" {
		t.Fatalf("bad complete again without a rebuild: %+v", st)
	}
	if got := metricValue(s.metrics.SyntheticClears.WithLabelValues("index_error")); got < 1 {
		t.Fatalf("recovery clears counted %v", got)
	}
}

// A recovery clear queued behind a batch that already cleared the pod is
// skipped: it would drop what that batch stored.
func TestRecoveryClearSkippedOnceCleared(t *testing.T) {
	sink := newCollectSink()
	s, err := NewSubscriber(Config{}, sink, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	k := streamKey{"p", 0}
	s.trust.set(k, trustEntry{hold: holdIndexError, model: "m"})
	d := s.dispatcher
	d.applyCtx, d.applyCancel = context.WithCancel(context.Background())
	defer d.applyCancel()
	clear := &event.Batch{Pod: "p", Model: "m", Events: []event.Event{{Kind: event.AllBlocksCleared}}}
	d.apply(queued{batch: &event.Batch{Pod: "p", Model: "m", Seq: 7}}) // went through: the pod is cleared
	d.apply(queued{batch: clear, recovery: true})
	if got := len(sink.snapshot()); got != 1 || !s.Servable("p", 0) {
		t.Fatalf("sink saw %d batches, servable %v; want the live batch only", got, s.Servable("p", 0))
	}
}

// A pod whose stream expires while its clear fails stays held though its
// stream is gone (its entries are still in the index), and is recovered by
// a clear once the sink reports one that went through.
func TestForgottenPodStaysHeldUntilCleared(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0", PodExpiry: 50 * time.Millisecond}, sink, nil)
	pub := startPub(t, s.BindAddr(), false)
	if err := pub.WaitSubscribed(testCtx(t), "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("kv@quiet@m", 0, payload(t, storedBatch(1))); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "quiet's batch", hasSeq("quiet", 0))
	sink.fail("quiet", true)
	deadline := time.Now().Add(testTimeout)
	for len(s.Streams()) != 0 || s.Servable("quiet", 0) {
		if time.Now().After(deadline) {
			t.Fatalf("never expired and held: streams %+v, servable %v", s.Streams(), s.Servable("quiet", 0))
		}
		time.Sleep(time.Millisecond)
	}
	states := make([]StreamState, 1)
	s.StreamStates([]StreamRef{{"quiet", 0}}, states)
	if states[0].Known || states[0].Held != "index_error" {
		t.Fatalf("the forgotten pod: %+v", states[0])
	}
	sink.fail("quiet", false)
	for !s.Servable("quiet", 0) {
		if time.Now().After(deadline) {
			t.Fatal("the forgotten pod was never recovered")
		}
		time.Sleep(time.Millisecond)
	}
	bs := sink.snapshot()
	if last := bs[len(bs)-1]; last.Pod != "quiet" || last.Model != "m" || last.Events[0].Kind != event.AllBlocksCleared {
		t.Fatalf("last batch %+v, want quiet's recovery clear", last)
	}
}

// At most one recovery clear per held pod is queued at a time: a backend
// that hangs each clear for its call deadline must not fill the worker's
// queue with them.
func TestOneRecoveryClearQueuedPerPod(t *testing.T) {
	s, err := NewSubscriber(Config{}, newCollectSink(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	k := streamKey{"p", 0}
	s.trust.set(k, trustEntry{hold: holdIndexError, model: "m"})
	ctx := context.Background()
	clears := func() float64 { return metricValue(s.metrics.SyntheticClears.WithLabelValues("index_error")) }
	s.recover(ctx)
	s.recover(ctx)
	if got := clears(); got != 1 {
		t.Fatalf("%v recovery clears queued for one pod, want 1", got)
	}
	// The worker takes it (the index still fails: the pod stays held).
	if !s.recoveryDue(&event.Batch{Pod: "p"}) {
		t.Fatal("the queued clear of a held pod is not due")
	}
	s.applied(&event.Batch{Pod: "p", Model: "m"}, event.ApplyOutcome{IndexFailed: true})
	s.recover(ctx)
	if got := clears(); got != 2 {
		t.Fatalf("%v recovery clears after the first was applied, want 2", got)
	}
}
