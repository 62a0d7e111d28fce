package kvevents

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// Issue 26 item 4: a pod flooding large batches on the worker of an honest
// pod holds only its own share of the worker (4 MiB at the default budget):
// past it its batches overflow (its reader would wait, here QueueWait < 0
// drops at once) while the honest pod's batch is queued behind at most that
// share, not behind the whole 256 MiB budget. Each stream says how late it
// is (ApplyLag) while its batches wait.
func TestFloodingPodHoldsOnlyItsShare(t *testing.T) {
	s, src, m := handleOnly(t, Config{QueueSize: 1024, QueueWait: -1}, nil)
	ctx := context.Background()
	big := make([]uint64, 110_000) // ~900 KB queued
	for i := range big {
		big[i] = uint64(i + 1)
	}
	for seq := uint64(0); seq < 20; seq++ {
		s.handle(ctx, src, frames(t, "kv@flood@m", seq, storedBatch(big...)))
	}
	s.handle(ctx, src, frames(t, "kv@honest@m", 0, storedBatch(1, 2)))
	var flood, honest StreamStats
	for _, st := range s.Streams() {
		switch st.Pod {
		case "flood":
			flood = st
		case "honest":
			honest = st
		}
	}
	if flood.Overflows == 0 || flood.Complete {
		t.Fatalf("the flooding pod queued 20 batches of 900 KB without overflowing: %+v", flood)
	}
	if honest.Overflows != 0 || !honest.Complete {
		t.Fatalf("honest pod %+v", honest)
	}
	if got := s.dispatcher.budget.used.Load(); got > s.dispatcher.share.bytes+1<<20 {
		t.Fatalf("%d bytes queued, want at most the flooding pod's share %d and the honest batch", got, s.dispatcher.share.bytes)
	}
	if flood.ApplyLag <= 0 || honest.ApplyLag <= 0 {
		t.Fatalf("queued streams report no apply lag: flood %v honest %v", flood.ApplyLag, honest.ApplyLag)
	}
	if v := metricValue(m.QueueOverflows); v != float64(flood.Overflows) {
		t.Fatalf("overflows %v, flood stream %d", v, flood.Overflows)
	}
	q := drain(s) // the worker's turn: the streams in turn (dispatcher_workqueue.go)
	if len(q) > 6 {
		t.Fatalf("%d batches queued, want at most the flood's share and the honest batch", len(q))
	}
	if i := slices.IndexFunc(q, func(b *event.Batch) bool { return b.Pod == "honest" }); i < 0 || i > 1 {
		t.Fatalf("the honest batch came at %d, want at most one flood batch ahead of it", i)
	}
	for _, st := range s.Streams() {
		if st.ApplyLag != 0 {
			t.Fatalf("%s: apply lag %v with nothing queued", st.Pod, st.ApplyLag)
		}
	}
}

// A batch waiting is a lag, whatever the wall clock did since it was
// queued: 0 says every batch is applied.
func TestApplyLagNeverZeroWhileQueued(t *testing.T) {
	var q streamBacklog
	share := newQueueShare(1024, 256<<20)
	queued := time.Now()
	if !q.reserve(100, share, queued) {
		t.Fatal("the first batch was refused")
	}
	if lag := q.lag(queued.Add(-time.Hour)); lag <= 0 {
		t.Fatalf("lag %v with a batch queued, the clock stepped back", lag)
	}
	if lag := q.lag(queued.Add(time.Second)); lag != time.Second {
		t.Fatalf("lag %v, want 1s", lag)
	}
	q.applied(100)
	if lag := q.lag(queued.Add(time.Second)); lag != 0 {
		t.Fatalf("lag %v with nothing queued", lag)
	}
}
