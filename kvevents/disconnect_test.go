package kvevents

import (
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// streamWhen waits until pod's stream satisfies ok and returns it.
func streamWhen(t *testing.T, s *Subscriber, pod string, what string, ok func(StreamStats) bool) StreamStats {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		for _, st := range s.Streams() {
			if st.Pod == pod && ok(st) {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: streams %+v", what, s.Streams())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The end of the connection a pod publishes on (its engine died or closed
// it) marks that pod incomplete, "disconnected", at once; a pod on another
// connection is untouched. Its next batch on a new connection settles it:
// the next seq restores complete since 0, a gap (no replay address) makes
// it "gap".
func TestDisconnectMarksIncomplete(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, nil)
	ctx := testCtx(t)
	dying, other := startPub(t, s.BindAddr(), false), startPub(t, s.BindAddr(), false)
	if err := dying.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := other.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(0); seq < 2; seq++ {
		if err := dying.Publish("kv@pod-d@m", seq, payload(t, storedBatch(10+seq))); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Publish("kv@pod-e@m", 0, payload(t, storedBatch(20))); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "both pods", func(bs []*event.Batch) bool { return hasSeq("pod-d", 1)(bs) && hasSeq("pod-e", 0)(bs) })
	streamWhen(t, s, "pod-d", "pod-d complete", func(st StreamStats) bool { return st.Complete })

	dying.Close()
	st := streamWhen(t, s, "pod-d", "pod-d disconnected", func(st StreamStats) bool { return st.IncompleteReason == whyDisconnected })
	if st.Complete || st.CompleteSinceSeq != 2 {
		t.Fatalf("disconnected stream %+v", st)
	}
	if e := streamWhen(t, s, "pod-e", "pod-e", func(StreamStats) bool { return true }); !e.Complete {
		t.Fatalf("a pod on another connection was marked: %+v", e)
	}

	// It comes back and continues: nothing was lost.
	back := startPub(t, s.BindAddr(), false)
	if err := back.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := back.Publish("kv@pod-d@m", 2, payload(t, storedBatch(12))); err != nil {
		t.Fatal(err)
	}
	st = streamWhen(t, s, "pod-d", "pod-d complete again", func(st StreamStats) bool { return st.Complete })
	if st.CompleteSinceSeq != 0 || st.IncompleteReason != "" {
		t.Fatalf("after the next seq %+v", st)
	}

	// It goes again and comes back past a gap nobody can replay.
	back.Close()
	streamWhen(t, s, "pod-d", "pod-d disconnected again", func(st StreamStats) bool { return st.IncompleteReason == whyDisconnected })
	last := startPub(t, s.BindAddr(), false)
	if err := last.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := last.Publish("kv@pod-d@m", 5, payload(t, storedBatch(15))); err != nil {
		t.Fatal(err)
	}
	streamWhen(t, s, "pod-d", "pod-d gap", func(st StreamStats) bool { return st.IncompleteReason == whyGap })
}
