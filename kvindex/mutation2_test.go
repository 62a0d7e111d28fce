package kvindex

import (
	"context"
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
