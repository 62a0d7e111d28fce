package indexer

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
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
	// per-tier runs: every reader can load the storage's 4 blocks, its own
	// longer run or not
	if r.Pods[0].TierRuns != (TierCounts{event.TierGPU: 7, event.TierShared: 4}) ||
		r.Pods[1].TierRuns != (TierCounts{event.TierGPU: 2, event.TierShared: 4}) ||
		r.Pods[2].TierRuns != (TierCounts{event.TierCPU: 1, event.TierShared: 4}) {
		t.Fatalf("tier runs: %+v %+v %+v", r.Pods[0].TierRuns, r.Pods[1].TierRuns, r.Pods[2].TierRuns)
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

	// Pick: the credited run is the candidate's match, but the policy
	// compares own runs (routeMatched): pod-a's 2 GPU blocks beat pod-b's 1
	// CPU block plus 4 shared; a source named as a candidate matches nothing
	var pr PickResult
	mustPick(t, ix, &PickQuery{Query: *q, Candidates: []Candidate{idle("pod-a"), idle("pod-b"), idle("NAS")}}, &pr)
	if pr.Pod != "pod-a" || cand(&pr, "pod-b").MatchedBlocks != 5 || cand(&pr, "pod-b").Tiers[event.TierShared] != 4 ||
		cand(&pr, "NAS").MatchedBlocks != 0 {
		t.Fatalf("pick: %s %+v", pr.Pod, pr.Candidates)
	}

	// the listing's storage flag
	if !ix.IsStorage("NAS") || !ix.IsStorage("OBJECT_STORE") || ix.IsStorage("pod-a") || ix.IsStorage("SHARED_STORAGE") == false {
		t.Fatal("IsStorage")
	}
}

// Without configuration no medium is a storage source (issue 35): a batch
// whose topic names SHARED_STORAGE or OBJECT_STORE is refused and counted,
// and leaves every score and pick as it was.
func TestUnconfiguredStorageClaimIsRefused(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	if ix.IsStorage("SHARED_STORAGE") || ix.IsStorage("OBJECT_STORE") {
		t.Fatal("a medium is a source without configuration")
	}
	prompt := seqTokens(3000, 2*testBlock)
	apply(ix, "pod-a", 0, storeEvent(prompt, 1, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(seqTokens(90000, testBlock), 1, event.TierGPU))
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	want := mustScore(t, ix, q, &r)
	var pr PickResult
	pq := &PickQuery{Query: *q, Candidates: []Candidate{idle("pod-b"), idle("pod-a")}}
	mustPick(t, ix, pq, &pr)
	wantPod := pr.Pod
	for _, medium := range StorageMedia {
		apply(ix, medium, 0, storageStore(prompt, 2))
	}
	if got := mustScore(t, ix, q, &r); got != want || got != "total=2 pod-a:1/4/1.00[0:1,]" {
		t.Fatalf("after the claims: %s, want %s", got, want)
	}
	if mustPick(t, ix, pq, &pr); pr.Pod != wantPod || pr.Pod != "pod-a" {
		t.Fatalf("pick moved: %s, want pod-a", pr.Pod)
	}
	if n := testutil.ToFloat64(ix.m.storageRefused); n != 2 {
		t.Fatalf("refused %v, want 2", n)
	}
}

// The scenario with the source configured: pod-a holds block 0 on
// GPU, pod-b nothing of the prompt, the storage blocks 0-1. pod-b is
// credited 2 shared blocks and pod-a 1 own + 1 shared; every policy that
// reads the cache picks pod-a (pod-b listed first, so a tie would go to it).
func TestStorageCreditNeverOutranksOwnRun(t *testing.T) {
	ix := newTestIndexer(t, Config{StorageReaders: map[string][]string{"SHARED_STORAGE": nil}})
	prompt := seqTokens(3000, 2*testBlock)
	apply(ix, "pod-a", 0, storeEvent(prompt, 1, event.TierGPU))
	apply(ix, "pod-b", 0, storeEvent(seqTokens(90000, testBlock), 1, event.TierGPU))
	apply(ix, "SHARED_STORAGE", 0, storageStore(prompt, 2))
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	if got := mustScore(t, ix, q, &r); got != "total=2 pod-a:2/8/1.40[0:2,] pod-b:2/8/0.80[0:2,]" {
		t.Fatalf("score: %s", got)
	}
	for _, pol := range routing.Names() {
		if pol == routing.NameLeastLoaded {
			continue // reads no cache
		}
		var pr PickResult
		mustPick(t, ix, &PickQuery{Query: *q, Policy: pol, Candidates: []Candidate{idle("pod-b"), idle("pod-a")}}, &pr)
		if pr.Pod != "pod-a" || cand(&pr, "pod-b").MatchedBlocks != 2 {
			t.Errorf("%s: picked %s (%+v)", pol, pr.Pod, pr.Candidates)
		}
	}
}

// routeMatched leaves the storage credit out of the Matched a policy reads;
// with Validate's bound on the shared weight, a pod's own run of k blocks
// on gpu, cpu or disk is worth at least any j <= k shared blocks.
func TestRouteMatchedRule(t *testing.T) {
	for _, c := range []struct {
		matched int
		shared  int32
		want    int
	}{{0, 0, 0}, {2, 0, 2}, {2, 2, 0}, {5, 3, 2}, {1, 3, 0}} {
		if got := routeMatched(c.matched, c.shared); got != c.want {
			t.Errorf("routeMatched(%d, %d) = %d, want %d", c.matched, c.shared, got, c.want)
		}
	}
	w := kvindex.DefaultTierWeights()
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, own := range []event.Tier{event.TierGPU, event.TierCPU, event.TierDisk} {
		bad := w
		bad[event.TierShared] = bad[own] + 0.01
		if err := bad.Validate(); err == nil {
			t.Errorf("shared weight above %s accepted", own)
		}
		for k := 1; k <= 4; k++ {
			for j := 0; j <= k; j++ {
				if float64(k)*w[own] < float64(j)*w[event.TierShared] || routeMatched(k, 0) <= routeMatched(j, int32(j)) {
					t.Errorf("%s: own %d does not beat shared %d", own, k, j)
				}
			}
		}
	}
}
