package kvindex

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

func TestUnmix64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 64))
	for _, x := range []uint64{0, 1, 1 << 63, ^uint64(0), holderSig(0)} {
		if got := unmix64(mix64(x)); got != x {
			t.Fatalf("unmix64(mix64(%#x)) = %#x", x, got)
		}
	}
	for range 10000 {
		x := rng.Uint64()
		if unmix64(mix64(x)) != x || mix64(unmix64(x)) != x {
			t.Fatalf("unmix64 does not invert mix64 at %#x", x)
		}
	}
}

// TestScorePrefixStepsChangingSeveralHolders aims at the one-holder rule's
// guard: consecutive blocks whose holder counts differ by one although
// several holders changed (some pods leave, others join, tiers move). The
// signatures' difference then decodes to a word that is not the change, and
// the step must fall back to a full diff.
func TestScorePrefixStepsChangingSeveralHolders(t *testing.T) {
	ctx := context.Background()
	w := DefaultTierWeights()
	rng := rand.New(rand.NewPCG(2, 64))
	for r := 0; r < 400; r++ {
		f := &fleetBuilder{t: t, idx: NewMemoryIndex(MemoryConfig{}), ref: &refIndex{holders: map[refKey]map[Holder]bool{}}}
		keys := []blockkeys.Key{blockkeys.Key(rng.Uint64()), blockkeys.Key(rng.Uint64()), blockkeys.Key(rng.Uint64())}
		const npods = 24
		pods := make([]PodID, npods)
		for p := range pods {
			pods[p] = PodID(p)
		}
		// block 0: a random set of pods; each later block drops some of the
		// previous block's holders and adds others, one more added than
		// dropped or one fewer
		held := map[Holder]bool{}
		for range 4 + rng.IntN(12) {
			held[Holder{Pod: PodID(rng.IntN(npods)), Tier: event.Tier(rng.IntN(2))}] = true
		}
		for i, k := range keys {
			if i > 0 {
				drop := 1 + rng.IntN(3)
				add := drop + 1 - 2*rng.IntN(2)
				for h := range held {
					if drop == 0 {
						break
					}
					delete(held, h)
					drop--
				}
				for add > 0 {
					h := Holder{Pod: PodID(rng.IntN(npods)), Tier: event.Tier(rng.IntN(2))}
					if !held[h] {
						held[h] = true
						add--
					}
				}
			}
			for h := range held {
				f.add(0, h.Pod, h.Tier, []blockkeys.Key{k})
			}
		}
		var res ScoreResult
		if err := NewScorer(f.idx, f.idx, w).Score(ctx, 0, keys, nil, &res); err != nil {
			t.Fatal(err)
		}
		if want := refScore(f.ref, 0, keys, pods, w); !samePodScores(res.Pods, want) {
			t.Fatalf("round %d:\n got  %v\n want %v", r, res.Pods, want)
		}
	}
}
