package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Pods restored from a snapshot are listed but not scored until their
// first batch: one that continues the sequence brings the pod back with
// everything restored; one at or below the snapshot's seq (the engine
// restarted since) clears it first. A pod without a known seq is cleared
// too: nothing proves its snapshot still holds.
func TestRestoredPodsWaitForTheirStream(t *testing.T) {
	x := newTestIndexer(t, Config{})
	prompt := seqTokens(500, 8*testBlock)
	for _, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		apply(x, pod, 0, storeEvent(prompt, 6, event.TierGPU))
	}
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	if got := mustScore(t, x, q, &r); got != "total=8 pod-a:6/24/6.00[0:6,] pod-b:6/24/6.00[0:6,] pod-c:6/24/6.00[0:6,]" {
		t.Fatalf("before: %s", got)
	}
	x.MarkRestored([]RestoredPod{{Name: "pod-a", Seq: 5, HasSeq: true}, {Name: "pod-b", Seq: 5, HasSeq: true}, {Name: "pod-c"}})
	if got := mustScore(t, x, q, &r); got != "total=8" || x.StalePods() != 3 {
		t.Fatalf("stale pods scored: %s (%d stale)", got, x.StalePods())
	}
	stale := 0
	for _, p := range x.Pods(context.Background(), nil) {
		if p.Stale {
			stale++
		}
	}
	if stale != 3 {
		t.Errorf("%d pods listed stale, want 3", stale)
	}
	more := storeEvent(prompt, 8, event.TierGPU)
	more.BlockHashes, more.TokenIDs = more.BlockHashes[6:], more.TokenIDs[6*testBlock:]
	more.ParentHash, more.HasParent = blockHashes(prompt, blockkeys.RequestExtras{})[5], true
	batch := func(pod string, seq uint64, ev event.Event) {
		x.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: testModel, Seq: seq, Events: []event.Event{ev}})
	}
	batch("pod-a", 6, more)                                         // resumes: 6 restored + 2 new
	batch("pod-b", 0, storeEvent(prompt, 2, event.TierGPU))         // restarted: only what it stored since
	batch("pod-c", 9, storeEvent(seqTokens(9000, testBlock), 1, 0)) // unknown seq: cleared, nothing of the prompt
	if got := mustScore(t, x, q, &r); got != "total=8 pod-a:8/32/8.00[0:8,] pod-b:2/8/2.00[0:2,]" {
		t.Errorf("after the streams resumed: %s", got)
	}
	if x.StalePods() != 0 {
		t.Errorf("%d pods still stale", x.StalePods())
	}
}
