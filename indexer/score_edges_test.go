package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Edges of scoring and pod listings: each test names what it holds.

// A pod filter naming only unknown pods answers nothing, also into a fresh
// Result (whose candidate buffer is nil: an empty filter must not turn into
// "no filter", which would score every pod).
func TestUnknownPodFilterWithFreshResult(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(1, 4*testBlock)
	apply(ix, "pod-a", 0, storeEvent(prompt, 4, event.TierGPU))
	for _, pods := range [][]string{{"nope"}, {"nope", "other"}} {
		for _, q := range []Query{
			{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: pods},
			{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{}), Pods: pods},
		} {
			var r Result
			if got := mustScore(t, ix, &q, &r); got != "total=4" {
				t.Fatalf("filter %v, %s input: %s, want no pods", pods, q.Kind, got)
			}
		}
	}
	var r Result
	q := Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"nope", "pod-a"}}
	if got := mustScore(t, ix, &q, &r); got != "total=4 pod-a:4/16/4.00[0:4,]" {
		t.Fatalf("filter with one known pod: %s", got)
	}
}

// Exactly MaxInputLen entries are accepted; one more is refused.
func TestMaxInputLenEdge(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	var r Result
	tokens := make([]uint32, MaxInputLen)
	if err := ix.Score(context.Background(), &Query{Model: testModel, Kind: InputTokens, TokenIDs: tokens}, &r); err != nil {
		t.Fatalf("%d token ids: %v", MaxInputLen, err)
	}
	if r.TotalBlocks != MaxInputLen/testBlock {
		t.Fatalf("TotalBlocks = %d", r.TotalBlocks)
	}
	hashes := make([]uint64, MaxInputLen)
	if err := ix.Score(context.Background(), &Query{Model: testModel, Kind: InputHashes, BlockHashes: hashes}, &r); err != nil {
		t.Fatalf("%d block hashes: %v", MaxInputLen, err)
	}
	hashes = append(hashes, 0)
	if err := ix.Score(context.Background(), &Query{Model: testModel, Kind: InputHashes, BlockHashes: hashes}, &r); err == nil {
		t.Fatalf("%d block hashes accepted", len(hashes))
	}
}

// Ranks of a pod are listed best first: score, then matched blocks (equal
// scores from different tiers), then the lower rank; pods likewise by
// score, then blocks, then name.
func TestRankAndPodOrderingTies(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(1, 8*testBlock)
	// pod-a: rank 2 = 4 GPU blocks (4.0), rank 1 = 8 disk blocks (4.0),
	// rank 0 = 4 GPU blocks (4.0), rank 3 = 2 GPU blocks
	apply(ix, "pod-a", 2, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "pod-a", 1, storeEvent(prompt, 8, event.TierDisk))
	apply(ix, "pod-a", 0, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "pod-a", 3, storeEvent(prompt, 2, event.TierGPU))
	// pod-c: 4 GPU (4.0, 4 blocks); pod-b: the same; pod-d: 8 disk (4.0, 8 blocks)
	apply(ix, "pod-c", 0, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "pod-d", 0, storeEvent(prompt, 8, event.TierDisk))
	var r Result
	got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r)
	want := "total=8 pod-a:8/32/4.00[1:8,0:4,2:4,3:2,] pod-d:8/32/4.00[0:8,] pod-b:4/16/4.00[0:4,] pod-c:4/16/4.00[0:4,]"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if tiers := r.Pods[0].Tiers; tiers[event.TierDisk] != 8 || tiers[event.TierGPU] != 0 {
		t.Fatalf("pod-a tiers %v: want its best rank's (8 disk)", tiers)
	}
}

// A Result reused after a filtered query scores every pod on an unfiltered
// one: the candidate buffer left from the filter must not act as a filter.
func TestReusedResultUnfilteredAfterFiltered(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(1, 2*testBlock)
	apply(ix, "pod-a", 0, storeEvent(prompt, 2, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(prompt, 1, event.TierGPU))
	var r Result
	q := Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"pod-b"}}
	if got := mustScore(t, ix, &q, &r); got != "total=2 pod-b:1/4/1.00[0:1,]" {
		t.Fatalf("filtered: %s", got)
	}
	q.Pods = nil
	if got := mustScore(t, ix, &q, &r); got != "total=2 pod-a:2/8/2.00[0:2,] pod-b:1/4/1.00[0:1,]" {
		t.Fatalf("unfiltered with the same Result: %s", got)
	}
}

// Pods lists the extra pods a caller names even when there are more of them
// than pods with events.
func TestPodsListsMoreExtraPodsThanSeen(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, testBlock), 1, event.TierGPU))
	got := ix.Pods(context.Background(), []PodRef{{"pod-x", 0}, {"pod-y", 0}, {"pod-z", 1}})
	if len(got) != 4 {
		t.Fatalf("Pods listed %d entries, want 4: %+v", len(got), got)
	}
}
