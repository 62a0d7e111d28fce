package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// Pods restored from a snapshot are listed but not scored until their
// first batch: one that continues the sequence brings the pod back with
// everything restored; one at or below the snapshot's seq (the engine
// restarted since) clears it first. A pod without a known seq is cleared
// too: nothing proves its snapshot still holds. The subscriber decides all
// of it (ResumeFrom); the indexer only asks.
func TestRestoredPodsWaitForTheirStream(t *testing.T) {
	ix, pub := runEventIndexer(t, testKeys, kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), 1)
	prompt := seqTokens(500, 8*testBlock)
	// What a snapshot load leaves in the index, before any stream.
	for _, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		ix.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: "org/model",
			Events: []event.Event{storeEvent(prompt, 6, event.TierGPU)}})
	}
	q := &Query{Model: "org/model", Kind: InputTokens, TokenIDs: prompt}
	var r Result
	if got := mustScore(t, ix, q, &r); got != "total=8 pod-a:6/24/6.00[0:6,] pod-b:6/24/6.00[0:6,] pod-c:6/24/6.00[0:6,]" {
		t.Fatalf("before: %s", got)
	}
	sub := ix.Subscriber()
	sub.ResumeFrom("pod-a", 0, 5, true)
	sub.ResumeFrom("pod-b", 0, 5, true)
	sub.ResumeFrom("pod-c", 0, 0, false)
	if got := mustScore(t, ix, q, &r); got != "total=8" || ix.StalePods() != 3 {
		t.Fatalf("stale pods scored: %s (%d stale)", got, ix.StalePods())
	}
	stale := 0
	for _, p := range ix.Pods(context.Background(), nil) {
		if p.Stale {
			stale++
		}
	}
	if stale != 3 {
		t.Errorf("%d pods listed stale, want 3", stale)
	}
	publishBatch(t, pub, testKeys, "pod-a", 0, 6, prompt)                     // resumes: 6 restored + 2 new
	publishBatch(t, pub, testKeys, "pod-b", 0, 0, prompt[:2*testBlock])       // restarted: only what it stored since
	publishBatch(t, pub, testKeys, "pod-c", 0, 9, seqTokens(9000, testBlock)) // unknown seq: cleared, nothing of the prompt
	scoreUntil(t, ix, q, "the streams resumed", func(r *Result) bool {
		return summary(r) == "total=8 pod-a:8/32/8.00[0:8,] pod-b:2/8/2.00[0:2,]" && ix.StalePods() == 0
	})
	if n := ix.Subscriber().RestoreClears(); n != 2 {
		t.Errorf("%d restore clears, want 2", n)
	}
}
