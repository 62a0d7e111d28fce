package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Edges of stream ordering, overflow and catch-up.

// Streams are listed by pod, then DP rank.
func TestStreamsSortedByPodThenRank(t *testing.T) {
	s, _, _ := handleOnly(t, Config{}, nil)
	for _, k := range []streamKey{{"b", 0}, {"a", 1}, {"c", 0}, {"a", 0}} {
		if st, why := s.admit(k, "m"); st == nil {
			t.Fatal(why)
		}
	}
	var got []string
	for _, st := range s.Streams() {
		got = append(got, st.Pod+string(rune('0'+st.DPRank)))
	}
	if strings.Join(got, " ") != "a0 a1 b0 c0" {
		t.Fatalf("order %v", got)
	}
}

// Overflows in a row: one warning, the stream incomplete since the batch
// after the last one lost, and the synthetic clear put in front of the next
// batch even when that batch has no events of its own.
func TestOverflowRunAndClearBeforeEmptyBatch(t *testing.T) {
	h := &countHandler{}
	s, src, _ := handleOnly(t, Config{QueueSize: 1, QueueWait: -1}, slog.New(h))
	ctx := context.Background()
	for seq := uint64(0); seq < 3; seq++ { // 0 fills the queue, 1 and 2 overflow
		s.handle(ctx, src, frames(t, "kv@p@m", seq, storedBatch(seq+10)))
	}
	h.mu.Lock()
	warned := 0
	for _, l := range h.lines {
		if strings.Contains(l, "worker queue full") {
			warned++
		}
	}
	h.mu.Unlock()
	if warned != 1 {
		t.Fatalf("%d queue-full warnings for one run of overflows", warned)
	}
	st := s.Streams()[0]
	if st.Overflows != 2 || st.Complete || st.IncompleteReason != "overflow" || st.CompleteSinceSeq != 3 {
		t.Fatalf("stream %+v", st)
	}
	if n := len(drain(s)); n != 1 {
		t.Fatalf("%d batches queued", n)
	}
	s.handle(ctx, src, frames(t, "kv@p@m", 3, &event.Batch{}))
	got := drain(s)
	if len(got) != 1 || got[0].Seq != 3 || len(got[0].Events) != 1 || got[0].Events[0].Kind != event.AllBlocksCleared {
		t.Fatalf("after the overflow: %+v", got)
	}
}

// Live copies of batches catch-up delivered are dropped as duplicates (not
// taken for a restart or a stale seq), from the first catch-up batch on;
// only a live batch ends that window, catch-up batches extend it.
func TestCatchUpCopiesDroppedAsDuplicates(t *testing.T) {
	ctx := context.Background()
	seqs := func(t *testing.T, steps []struct {
		seq uint64
		how seqSource
	}) (*Subscriber, *Metrics) {
		s, src, m := handleOnly(t, Config{}, nil)
		st, why := s.admit(streamKey{"p", 0}, "m")
		if st == nil {
			t.Fatal(why)
		}
		for _, x := range steps {
			b := storedBatch(x.seq + 100)
			b.Pod, b.Model, b.Seq = "p", "m", x.seq
			s.sequence(ctx, st, src, b, 0, nil, x.how)
		}
		return s, m
	}
	type step = struct {
		seq uint64
		how seqSource
	}
	check := func(t *testing.T, s *Subscriber, m *Metrics, dups float64, batches uint64) {
		t.Helper()
		st := s.Streams()[0]
		if d := metricValue(m.DroppedFrames.WithLabelValues("duplicate")); d != dups || st.Restarts != 0 || st.Batches != batches {
			t.Fatalf("duplicates %v (want %v), stream %+v", d, dups, st)
		}
	}
	// the live copy of the only catch-up batch (its seq is also the last)
	s, m := seqs(t, []step{{20, fromCatchUp}, {20, fromLive}})
	check(t, s, m, 1, 1)
	// two catch-up batches, both copies arrive live, then a new one
	s, m = seqs(t, []step{{5, fromCatchUp}, {6, fromCatchUp}, {5, fromLive}, {6, fromLive}, {7, fromLive}})
	check(t, s, m, 2, 3)
}

// A source with a replay endpoint is not "replaying" for batches in order.
func TestInOrderBatchIsNotReplaying(t *testing.T) {
	s, src, _ := handleOnly(t, Config{}, nil)
	src.replay = "tcp://127.0.0.1:9" // never asked: nothing is missing
	for seq := uint64(0); seq < 2; seq++ {
		s.handle(context.Background(), src, frames(t, "kv@p@m", seq, storedBatch(seq+10)))
	}
	if st := s.Streams()[0]; st.Replaying || st.Batches != 2 || !st.Complete {
		t.Fatalf("stream %+v", st)
	}
}

// Batches lost beyond repair (a gap, no replay endpoint) on a live stream
// with a snapshot endpoint make the subscriber ask for a snapshot; here the
// endpoint does not answer, which is counted as an error.
func TestGapAsksSnapshotEndpoint(t *testing.T) {
	s, src, m := handleOnly(t, Config{ReplayTimeout: 100 * time.Millisecond}, nil)
	src.snapshot = fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t)) // nothing listens
	ctx := testCtx(t)
	s.handle(ctx, src, frames(t, "kv@p@m", 0, storedBatch(10)))
	if v := metricValue(m.Snapshots.WithLabelValues("error")); v != 0 {
		t.Fatalf("snapshot asked for a complete stream: %v", v)
	}
	s.handle(ctx, src, frames(t, "kv@p@m", 5, storedBatch(15)))
	if v := metricValue(m.Snapshots.WithLabelValues("error")); v != 1 {
		t.Fatalf("snapshot requests after a gap: %v", v)
	}
	if st := s.Streams()[0]; st.Complete || st.IncompleteReason != "gap" {
		t.Fatalf("stream %+v", st)
	}
}
