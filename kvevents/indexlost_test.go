package kvevents

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// A stream marked by the index's loss stays incomplete through in-order
// batches (they rebuild only what they carry) and is complete again only
// after the engine's own clear.
func TestMarkIndexLostHoldsUntilRebuilt(t *testing.T) {
	s, sink, send := startCollecting(t)
	stats := func(pod string) StreamStats {
		for _, st := range s.Streams() {
			if st.Pod == pod {
				return st
			}
		}
		t.Fatalf("no stream %s", pod)
		return StreamStats{}
	}
	send("a", 0, storedBatch(1))
	send("b", 0, storedBatch(2))
	if !stats("a").Complete || !stats("b").Complete {
		t.Fatalf("not complete from seq 0: %+v %+v", stats("a"), stats("b"))
	}
	sink.fail("b", true)
	send("b", 1, storedBatch(5))
	waitStream(t, s, "b", "b's failed write recorded", func(st StreamStats) bool { return st.IncompleteReason == "index_error" })
	s.markPodIndexLost(streamKey{"nobody", 0}, "index_error") // unknown: ignored
	s.MarkIndexLost("index_lost")                             // b keeps its first reason
	if st := stats("a"); st.Complete || st.IncompleteReason != "index_lost" {
		t.Fatalf("a after MarkIndexLost: %+v", st)
	}
	if st := stats("b"); st.Complete || st.IncompleteReason != "index_error" {
		t.Fatalf("b after its failed write: %+v", st)
	}
	send("a", 1, storedBatch(3))
	if st := stats("a"); st.Complete || st.IncompleteReason != "index_lost" {
		t.Fatalf("a complete again after an in-order batch: %+v", st)
	}
	send("a", 2, &event.Batch{Events: []event.Event{{Kind: event.AllBlocksCleared}}})
	if st := stats("a"); !st.Complete || st.IncompleteReason != "" {
		t.Fatalf("a after the engine's clear: %+v", st)
	}
	send("a", 3, storedBatch(4))
	if st := stats("a"); !st.Complete {
		t.Fatalf("a after the clear and a batch: %+v", st)
	}
}
