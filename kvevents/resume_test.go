package kvevents

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// A stream resumed from a snapshot's sequence number treats its first batch
// as it would after that number: a jump forward is a gap, a jump back a
// restart whose batch starts with a clear; a stream that already received
// batches keeps its own number.
func TestResumeFrom(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, NewMetrics(nil))
	s.ResumeFrom("pod-gap", 0, 10)
	s.ResumeFrom("pod-restart", 0, 10)
	s.ResumeFrom("pod-next", 0, 10)
	if st := s.Streams(); len(st) != 3 || st[0].LastSeq != 10 || st[0].Batches != 0 {
		t.Fatalf("resumed streams %+v", st)
	}
	pub := startPub(t, s.BindAddr(), false)
	pub.WaitSubscribed(testCtx(t), "kv@")
	pub.Publish("kv@pod-gap@m", 14, payload(t, storedBatch(1)))
	pub.Publish("kv@pod-restart@m", 0, payload(t, storedBatch(2)))
	pub.Publish("kv@pod-next@m", 11, payload(t, storedBatch(3)))
	bs := sink.waitFor(t, "three batches", func(bs []*event.Batch) bool { return len(bs) == 3 })
	for _, b := range bs {
		cleared := b.Events[0].Kind == event.AllBlocksCleared
		if cleared != (b.Pod == "pod-restart") {
			t.Errorf("%s: cleared=%v", b.Pod, cleared)
		}
	}
	for _, st := range s.Streams() {
		switch st.Pod {
		case "pod-gap":
			if st.SeqGaps != 1 || st.MissedBatches != 3 || st.Restarts != 0 {
				t.Errorf("gap %+v", st)
			}
		case "pod-restart":
			if st.Restarts != 1 || st.SeqGaps != 0 {
				t.Errorf("restart %+v", st)
			}
		case "pod-next":
			if st.Restarts != 0 || st.SeqGaps != 0 || st.LastSeq != 11 {
				t.Errorf("next %+v", st)
			}
		}
	}
	s.ResumeFrom("pod-next", 0, 99)
	for _, st := range s.Streams() {
		if st.Pod == "pod-next" && st.LastSeq != 11 {
			t.Errorf("a live stream was moved to %d", st.LastSeq)
		}
	}
}
