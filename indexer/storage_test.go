package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// storageStore is a storage publisher's BlockStored as llm-d's connector
// sends it: hashes only, no tokens, no block size.
func storageStore(tokens []uint32, n int) event.Event {
	return event.Event{Kind: event.BlockStored, Medium: event.TierExternal,
		BlockHashes: blockHashes(tokens, blockkeys.RequestExtras{})[:n]}
}

// Storage blocks extend every reader's run on the shared tier; the source
// never appears; pods of another model and pods not named as readers get
// nothing; a reader's own longer run is not shortened.
func TestStorageIsASharedTier(t *testing.T) {
	ix := newTestIndexer(t, Config{StorageReaders: map[string][]string{
		"SHARED_STORAGE": nil,                      // every pod of the model
		"NAS":            {"pod-b", "pod-unknown"}, // named readers only
		"OBJECT_STORE":   {},                       // no reader
	}})
	prompt := seqTokens(3000, 8*testBlock)
	apply(ix, "pod-a", 0, storeEvent(prompt, 2, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(prompt, 1, event.TierCPU))
	apply(ix, "pod-long", 0, storeEvent(prompt, 7, event.TierGPU))
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-other", Model: "other-model",
		Events: []event.Event{storeEvent(prompt, 1, event.TierGPU)}})
	apply(ix, "SHARED_STORAGE", 0, storageStore(prompt, 4))
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	// pod-a 2 + 2*0.4, pod-b 0.8 + 3*0.4; pod-long keeps its 7 GPU blocks
	want := "total=8 pod-long:7/28/7.00[0:7,] pod-a:4/16/2.80[0:4,] pod-b:4/16/2.00[0:4,]"
	if got := mustScore(t, ix, q, &r); got != want {
		t.Fatalf("SHARED_STORAGE:\n got %s\nwant %s", got, want)
	}
	if r.Pods[1].Tiers != (TierCounts{event.TierGPU: 2, event.TierShared: 2}) ||
		r.Pods[2].Tiers != (TierCounts{event.TierCPU: 1, event.TierShared: 3}) {
		t.Fatalf("tiers: %+v %+v", r.Pods[1].Tiers, r.Pods[2].Tiers)
	}
	// a pods filter still sees the storage; the source itself is never a pod
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"pod-b", "SHARED_STORAGE"}}, &r); got != "total=8 pod-b:4/16/2.00[0:4,]" {
		t.Fatalf("filtered: %s", got)
	}

	// a reader with no block of its own appears through the storage alone
	apply(ix, "pod-c", 0, storeEvent(seqTokens(90000, testBlock), 1, event.TierGPU))
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"pod-c"}}, &r); got != "total=8 pod-c:4/16/1.60[0:4,]" {
		t.Fatalf("storage only: %s", got)
	}

	// named readers: NAS credits pod-b only (pod-unknown never published)
	apply(ix, "SHARED_STORAGE", 0, event.Event{Kind: event.AllBlocksCleared})
	apply(ix, "NAS", 0, storageStore(prompt, 5))
	apply(ix, "OBJECT_STORE", 0, storageStore(prompt, 8))
	want = "total=8 pod-long:7/28/7.00[0:7,] pod-b:5/20/2.40[0:5,] pod-a:2/8/2.00[0:2,]"
	if got := mustScore(t, ix, q, &r); got != want {
		t.Fatalf("named readers:\n got %s\nwant %s", got, want)
	}

	// Pick: the credited run is the candidate's match; a source named as a
	// candidate matches nothing
	var pr PickResult
	mustPick(t, ix, &PickQuery{Query: *q, Candidates: []Candidate{idle("pod-a"), idle("pod-b"), idle("NAS")}}, &pr)
	if pr.Pod != "pod-b" || cand(&pr, "pod-b").MatchedBlocks != 5 || cand(&pr, "pod-b").Tiers[event.TierShared] != 4 ||
		cand(&pr, "NAS").MatchedBlocks != 0 {
		t.Fatalf("pick: %s %+v", pr.Pod, pr.Candidates)
	}

	// the listing's storage flag
	if !ix.IsStorage("NAS") || !ix.IsStorage("OBJECT_STORE") || ix.IsStorage("pod-a") || ix.IsStorage("SHARED_STORAGE") == false {
		t.Fatal("IsStorage")
	}
}

// Without configuration llm-d's two media are storage sources.
func TestDefaultStorageReaders(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	if !ix.IsStorage("SHARED_STORAGE") || !ix.IsStorage("OBJECT_STORE") || ix.IsStorage("pod-a") {
		t.Fatal("defaults")
	}
}
