package kvevents

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/kvindex"
)

// Stream edges the third gremlins run (stream.go) showed unchecked.

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
	s.handle(ctx, src, frames(t, "kv@p@m", 3, &kvindex.Batch{}))
	got := drain(s)
	if len(got) != 1 || got[0].Seq != 3 || len(got[0].Events) != 1 || got[0].Events[0].Kind != kvindex.AllBlocksCleared {
		t.Fatalf("after the overflow: %+v", got)
	}
}
