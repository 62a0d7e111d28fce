package kvindex

import (
	"context"
	"errors"
	"runtime"
	"testing"
)

// Edges a gremlins run of hash.go, scorer.go and memindex_score.go showed
// unchecked (hack/mutation/EQUIVALENT.md lists the survivors that are not).

// The largest block size is accepted, one more is not: the bound is
// inclusive, as its error message says.
func TestNewHasherBlockSizeBounds(t *testing.T) {
	for _, c := range []struct {
		size int
		ok   bool
	}{{0, false}, {1, true}, {MaxBlockSize, true}, {MaxBlockSize + 1, false}} {
		_, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: c.size})
		if (err == nil) != c.ok {
			t.Errorf("block size %d: err = %v, want ok=%v", c.size, err, c.ok)
		}
	}
}

// A candidate id just past the last possible pod cannot match and must not
// index the per-pod tables (it would be past their end).
func TestScorePrefixCandidateBeyondMaxPods(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	keys := []Key{11, 12}
	if err := idx.Add(ctx, 0, 1, TierGPU, 0, keys); err != nil {
		t.Fatal(err)
	}
	for _, cands := range [][]PodID{{MaxPods, 1}, {1, MaxPods}, {MaxPods}} {
		var res ScoreResult
		if err := idx.ScorePrefix(ctx, 0, keys, cands, DefaultTierWeights(), &res); err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, p := range cands {
			if p == 1 {
				want = 1
			}
		}
		if len(res.Pods) != want {
			t.Fatalf("candidates %v: scores %+v", cands, res.Pods)
		}
		if want == 1 && (res.Pods[0].Pod != 1 || res.Pods[0].MatchedBlocks != 2) {
			t.Fatalf("candidates %v: scores %+v, want pod 1 with 2 blocks", cands, res.Pods)
		}
	}
}

// Under equal weights a block held on several tiers is credited to the
// first tier in holder order, and a pod's tier can change mid-run: the fused
// path's recount (a holder added at block 2) must agree with the generic
// path block by block, not keep the tier the run started on.
func TestScorePrefixEqualWeightTierChangeMidRun(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	keys := []Key{1, 2, 3, 4}
	if err := mem.Add(ctx, 0, 0, TierCPU, 0, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 0, TierGPU, 0, keys[2:]); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 1, TierGPU, 0, keys); err != nil { // keeps blocks in chunks
		t.Fatal(err)
	}
	flat := TierWeights{1, 1, 1, 1}
	var fused, generic ScoreResult
	if err := NewScorer(mem, mem, flat).Score(ctx, 0, keys, nil, &fused); err != nil {
		t.Fatal(err)
	}
	if err := NewScorer(visitorOnly{mem}, nil, flat).Score(ctx, 0, keys, nil, &generic); err != nil {
		t.Fatal(err)
	}
	if !samePodScores(fused.Pods, generic.Pods) {
		t.Fatalf("fused %+v\ngeneric %+v", fused.Pods, generic.Pods)
	}
	for _, ps := range fused.Pods {
		if ps.Pod == 0 && (ps.TierBlocks[TierCPU] != 2 || ps.TierBlocks[TierGPU] != 2) {
			t.Fatalf("pod 0: tiers %v, want 2 blocks on CPU then 2 on GPU", ps.TierBlocks)
		}
	}
}

// With a candidate filter the per-pod table only reaches the candidates;
// a non-candidate holder with the next id, whose holding changes along the
// walk, must not be looked up past the table's end.
func TestScorePrefixNonCandidateJustPastTable(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	keys := []Key{1, 2, 3}
	const beyond = 64 // the per-pod table of a fresh index grows to 64 entries at first
	if err := mem.Add(ctx, 0, 0, TierGPU, 0, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 5, TierGPU, 0, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, beyond, TierGPU, 0, keys[:1]); err != nil {
		t.Fatal(err)
	}
	var res ScoreResult
	if err := mem.ScorePrefix(ctx, 0, keys, []PodID{0}, DefaultTierWeights(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 1 || res.Pods[0].Pod != 0 || res.Pods[0].MatchedBlocks != 3 {
		t.Fatalf("scores %+v, want pod 0 with 3 blocks", res.Pods)
	}
}

// A generic-path call that visits no block (the first key is held by no
// one) after one whose walk ended with pods still extending: the pooled
// per-call state must not carry the earlier call's end of walk over.
func TestScorerGenericCallVisitingNothingAfterFullMatch(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	if err := mem.Add(ctx, 0, 3, TierGPU, 0, []Key{1, 2}); err != nil {
		t.Fatal(err)
	}
	s := NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())
	var res ScoreResult
	for range 20 { // the pool may hand out a fresh state now and then
		if err := s.Score(ctx, 0, []Key{1, 2}, nil, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Pods) != 1 || res.Pods[0].MatchedBlocks != 2 {
			t.Fatalf("full match: %+v", res.Pods)
		}
		if err := s.Score(ctx, 0, []Key{9, 1}, nil, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Pods) != 0 {
			t.Fatalf("no block 0 holder, yet scores %+v", res.Pods)
		}
	}
}

// A candidate id at MaxPods cannot be indexed, so the generic path skips it
// before sizing its per-pod table by it: one stray id must not cost a table
// of 2^24 entries (hundreds of MB) per pooled state.
func TestScorerGenericCandidateAtMaxPodsAllocatesNoTable(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	if err := mem.Add(ctx, 0, 1, TierGPU, 0, []Key{1}); err != nil {
		t.Fatal(err)
	}
	s := NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())
	var res ScoreResult
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := s.Score(ctx, 0, []Key{1}, []PodID{MaxPods, 1}, &res); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if len(res.Pods) != 1 || res.Pods[0].Pod != 1 {
		t.Fatalf("scores %+v, want pod 1 only", res.Pods)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("one call with candidate MaxPods allocated %d MB", grew>>20)
	}
}

// A pod id past the per-pod table's first size (64) grows it to hold that
// id, on both scoring paths and on a fresh pooled state.
func TestScoreHighPodIDOnFreshState(t *testing.T) {
	ctx := context.Background()
	for _, p := range []PodID{64, 100, 1000} {
		mem := NewMemoryIndex(MemoryConfig{})
		if err := mem.Add(ctx, 0, p, TierGPU, 0, []Key{1, 2}); err != nil {
			t.Fatal(err)
		}
		for _, sc := range []*Scorer{NewScorer(mem, mem, DefaultTierWeights()), NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())} {
			var res ScoreResult
			if err := sc.Score(ctx, 0, []Key{1, 2}, nil, &res); err != nil {
				t.Fatal(err)
			}
			if len(res.Pods) != 1 || res.Pods[0].Pod != p || res.Pods[0].MatchedBlocks != 2 {
				t.Fatalf("pod %d (prefix path %v): scores %+v", p, sc.prefix != nil, res.Pods)
			}
		}
	}
}

// Remove refuses what Add refuses: a tier past the last and a pod id past
// the last possible (which would index past the epoch pages).
func TestMemoryIndexRemoveBadTierAndPod(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	if err := idx.Add(ctx, 0, 1, TierGPU, 0, []Key{1}); err != nil {
		t.Fatal(err)
	}
	if err := idx.Remove(ctx, 0, 1, NumTiers, 0, []Key{1}); !errors.Is(err, errBadTier) {
		t.Errorf("Remove with tier NumTiers: err = %v", err)
	}
	if err := idx.Remove(ctx, 0, MaxPods, TierGPU, 0, []Key{1}); !errors.Is(err, errBadPod) {
		t.Errorf("Remove of pod MaxPods: err = %v", err)
	}
	if err := idx.Remove(ctx, 0, MaxPods-1, TierGPU, 0, []Key{1}); err != nil {
		t.Errorf("Remove of pod MaxPods-1 (never indexed): err = %v", err)
	}
}

// Tier names: every tier has its own, anything past the last is "unknown".
func TestTierStringEdges(t *testing.T) {
	want := []string{"gpu", "cpu", "disk", "external"}
	for tier := Tier(0); tier < NumTiers; tier++ {
		if got := tier.String(); got != want[tier] {
			t.Errorf("Tier(%d).String() = %q, want %q", tier, got, want[tier])
		}
	}
	for _, tier := range []Tier{NumTiers, NumTiers + 1, 255} {
		if got := tier.String(); got != "unknown" {
			t.Errorf("Tier(%d).String() = %q, want unknown", tier, got)
		}
	}
}
