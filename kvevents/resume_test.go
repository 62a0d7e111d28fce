package kvevents

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// A stream resumed from a snapshot's sequence number treats its first batch
// as it would after that number: a jump forward is a gap, a jump back a
// restart whose batch starts with a clear; one resumed without a number is
// cleared before its first batch. Every resumed pod is held (not servable)
// until a batch of its stream has been applied. A stream that already
// received batches keeps its own number.
func TestResumeFrom(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, NewMetrics(nil))
	s.ResumeFrom("pod-gap", 0, 10, true)
	s.ResumeFrom("pod-restart", 0, 10, true)
	s.ResumeFrom("pod-next", 0, 10, true)
	s.ResumeFrom("pod-noseq", 0, 0, false)
	if st := s.Streams(); len(st) != 4 || st[0].LastSeq != 10 || st[0].Batches != 0 || st[0].Held != "restored" {
		t.Fatalf("resumed streams %+v", st)
	}
	if s.RestoredWaiting() != 4 || s.Servable("pod-next", 0) {
		t.Fatalf("%d restored pods wait; pod-next servable %v", s.RestoredWaiting(), s.Servable("pod-next", 0))
	}
	pub := startPub(t, s.BindAddr(), false)
	pub.WaitSubscribed(testCtx(t), "kv@")
	pub.Publish("kv@pod-gap@m", 14, payload(t, storedBatch(1)))
	pub.Publish("kv@pod-restart@m", 0, payload(t, storedBatch(2)))
	pub.Publish("kv@pod-next@m", 11, payload(t, storedBatch(3)))
	pub.Publish("kv@pod-noseq@m", 5, payload(t, storedBatch(4)))
	bs := sink.waitFor(t, "four batches", func(bs []*event.Batch) bool { return len(bs) == 4 })
	for _, b := range bs {
		cleared := b.Events[0].Kind == event.AllBlocksCleared
		if cleared != (b.Pod == "pod-restart" || b.Pod == "pod-noseq") {
			t.Errorf("%s: cleared=%v", b.Pod, cleared)
		}
	}
	for _, pod := range []string{"pod-gap", "pod-restart", "pod-next", "pod-noseq"} {
		waitStream(t, s, pod, pod+" served", func(st StreamStats) bool { return st.Held == "" })
	}
	if s.RestoredWaiting() != 0 || s.RestoreClears() != 2 {
		t.Errorf("after the first batches: %d wait, %d restore clears; want 0, 2", s.RestoredWaiting(), s.RestoreClears())
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
	s.ResumeFrom("pod-next", 0, 99, true)
	for _, st := range s.Streams() {
		if st.Pod == "pod-next" && st.LastSeq != 11 {
			t.Errorf("a live stream was moved to %d", st.LastSeq)
		}
	}
}

// A stream resumed from a peer's copy that the peer had complete is
// complete once its first batch continues the copy in order, and since the
// peer's number; a gap nothing replays, a restart, or a plain ResumeFrom
// leave it as they would anyway (incomplete, or complete only from the
// restart's start).
func TestResumeFromPeer(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, NewMetrics(nil))
	s.ResumeFromPeer("peer-next", 0, 10, 3)
	s.ResumeFromPeer("peer-gap", 0, 10, 0)
	s.ResumeFromPeer("peer-restart", 0, 10, 0)
	s.ResumeFrom("file-next", 0, 10, true)
	for _, st := range s.Streams() {
		if st.Complete || st.IncompleteReason != "restored" {
			t.Errorf("%s before its first batch: %+v, want incomplete (restored)", st.Pod, st)
		}
	}
	pub := startPub(t, s.BindAddr(), false)
	pub.WaitSubscribed(testCtx(t), "kv@")
	pub.Publish("kv@peer-next@m", 11, payload(t, storedBatch(1)))
	pub.Publish("kv@peer-gap@m", 14, payload(t, storedBatch(2)))
	pub.Publish("kv@peer-restart@m", 0, payload(t, storedBatch(3)))
	pub.Publish("kv@file-next@m", 11, payload(t, storedBatch(4)))
	sink.waitFor(t, "four batches", func(bs []*event.Batch) bool { return len(bs) == 4 })
	for _, pod := range []string{"peer-next", "peer-gap", "peer-restart", "file-next"} {
		waitStream(t, s, pod, pod+" served", func(st StreamStats) bool { return st.Held == "" })
	}
	for _, st := range s.Streams() {
		switch st.Pod {
		case "peer-next":
			if !st.Complete || st.CompleteSinceSeq != 3 {
				t.Errorf("in order after a complete copy: %+v, want complete since 3", st)
			}
		case "peer-gap":
			if st.Complete {
				t.Errorf("gap not replayed after the copy: %+v, want incomplete", st)
			}
		case "peer-restart":
			// cleared, then seen from its new start
			if !st.Complete || st.CompleteSinceSeq != 0 || st.Restarts != 1 {
				t.Errorf("restart after the copy: %+v, want cleared and complete from seq 0", st)
			}
		case "file-next":
			if st.Complete || st.IncompleteReason != "restored" {
				t.Errorf("in order after a file (ResumeFrom): %+v, want still restored", st)
			}
		}
	}
}
