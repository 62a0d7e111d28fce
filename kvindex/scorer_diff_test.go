package kvindex

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
)

// refScore is the trivial reference scorer: for each pod, walk keys from
// block 0 while the pod holds the block on some tier, crediting the block to
// its best-weighted tier. pods lists the pods to score (candidates already
// applied).
func refScore(ref *refIndex, m ModelID, keys []blockkeys.Key, pods []PodID, w TierWeights) []PodScore {
	var out []PodScore
	for _, p := range pods {
		ps := PodScore{Pod: p}
		for _, k := range keys {
			best := event.Tier(event.NumTiers)
			for h := range ref.holders[refKey{m, k}] {
				if h.Pod == p && (best == event.NumTiers || w[h.Tier] > w[best]) {
					best = h.Tier
				}
			}
			if best == event.NumTiers {
				break
			}
			ps.MatchedBlocks++
			ps.TierBlocks[best]++
		}
		for t, n := range ps.TierBlocks {
			ps.Score += float64(n) * w[t]
		}
		ps.TierRuns = refTierRuns(ref, m, keys, p)
		if ps.MatchedBlocks > 0 {
			out = append(out, ps)
		}
	}
	slices.SortFunc(out, ComparePodScores)
	return out
}

// refTierRuns is PodScore.TierRuns the way llm-d's producer counts it
// (matchedBlockCountByTier): each tier on its own, blocks from block 0
// until the first one pod p does not hold on that tier.
func refTierRuns(ref *refIndex, m ModelID, keys []blockkeys.Key, p PodID) (runs [event.NumTiers]int32) {
	for t := range event.NumTiers {
		for _, k := range keys {
			if !ref.holders[refKey{m, k}][Holder{Pod: p, Tier: t}] {
				break
			}
			runs[t]++
		}
	}
	return runs
}

// fleetBuilder applies the same operations to a MemoryIndex and a refIndex.
type fleetBuilder struct {
	t   *testing.T
	idx *MemoryIndex
	ref *refIndex
}

func (f *fleetBuilder) add(m ModelID, p PodID, tier event.Tier, ks []blockkeys.Key) {
	f.t.Helper()
	if err := f.idx.Add(context.Background(), m, p, tier, ks); err != nil {
		f.t.Fatal(err)
	}
	f.ref.add(m, p, tier, ks)
}

func (f *fleetBuilder) remove(m ModelID, p PodID, tier event.Tier, ks []blockkeys.Key) {
	f.t.Helper()
	if err := f.idx.Remove(context.Background(), m, p, tier, ks); err != nil {
		f.t.Fatal(err)
	}
	f.ref.remove(m, p, tier, ks)
}

func (f *fleetBuilder) clear(p PodID) {
	f.t.Helper()
	if err := f.idx.ClearPod(context.Background(), p); err != nil {
		f.t.Fatal(err)
	}
	f.ref.clear(p)
}

// randomPrefixFleet fills f with the shapes that matter to the fused
// scorer: pods holding prefixes of different lengths (holder sets that
// shrink one pod at a time, the common case), pods dropping out in bunches,
// copies on other tiers and groups over sub-ranges, holes, pods cleared and
// re-added (stale and live words of one pod in one chunk), and unrelated
// keys sharing the tables.
func randomPrefixFleet(f *fleetBuilder, rng *rand.Rand, keys []blockkeys.Key, npods int) {
	n := len(keys)
	for p := PodID(0); p < PodID(npods); p++ {
		end := rng.IntN(n + 1)
		if rng.IntN(4) == 0 { // bunches: several pods share an end
			end = n / 2
		}
		f.add(0, p, event.TierGPU, keys[:end])
		for r := rng.IntN(3); r > 0; r-- { // other tiers or groups over a sub-range
			lo := rng.IntN(n)
			hi := lo + rng.IntN(n-lo+1)
			f.add(0, p, event.Tier(rng.IntN(int(event.NumStoredTiers))), keys[lo:hi])
		}
		if rng.IntN(4) == 0 && end > 0 { // a hole
			f.remove(0, p, event.TierGPU, keys[rng.IntN(end):][:1])
		}
		switch rng.IntN(8) {
		case 0:
			f.clear(p)
		case 1: // cleared, then re-added over part of its old range
			f.clear(p)
			f.add(0, p, event.Tier(rng.IntN(2)), keys[:rng.IntN(end+1)])
		}
	}
	other := make([]blockkeys.Key, 16)
	for i := range other {
		other[i] = blockkeys.Key(rng.Uint64())
	}
	f.add(1, PodID(rng.IntN(npods)), event.TierGPU, keys[:rng.IntN(n+1)]) // same keys, other model
	f.add(0, PodID(rng.IntN(npods)), event.TierGPU, other)
}

// TestScorerDifferential compares the fused path (MemoryIndex as a
// PrefixScorer), the generic Visitor path over the same index and the
// reference on many random fleets, with up to 96 pods so holder chunks
// pass through every size class the scorer meets in practice, and with
// further random changes between queries.
func TestScorerDifferential(t *testing.T) {
	ctx := context.Background()
	seeds := 200
	if testing.Short() || race.Enabled { // the concurrent test below is the one for -race
		seeds = 20
	}
	// distinct weights: with a tie, which tier a block counts for is not
	// defined
	weights := []TierWeights{DefaultTierWeights(), {0.1, 0.2, 0.3, 0.4}, {0.3, 1, 0.2, 0.5}}
	nonEmpty, multi := 0, 0
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		rng := rand.New(rand.NewPCG(seed, 14))
		f := &fleetBuilder{t: t, idx: NewMemoryIndex(MemoryConfig{}), ref: &refIndex{holders: map[refKey]map[Holder]bool{}}}
		npods := 1 + rng.IntN(96)
		keys := make([]blockkeys.Key, 1+rng.IntN(160))
		for i := range keys {
			keys[i] = blockkeys.Key(rng.Uint64())
		}
		randomPrefixFleet(f, rng, keys, npods)
		w := weights[rng.IntN(len(weights))]
		fused, generic := NewScorer(f.idx, f.idx, w), NewScorer(visitorOnly{f.idx}, nil, w)
		for q := 0; q < 6; q++ {
			pods := make([]PodID, 0, npods)
			var cands []PodID
			if rng.IntN(3) == 0 {
				cands = []PodID{}
				for p := PodID(0); p < PodID(npods+2); p++ {
					if rng.IntN(2) == 0 {
						cands = append(cands, p)
					}
				}
				if len(cands) > 0 {
					cands = append(cands, cands[0]) // a duplicate
				}
			}
			for p := PodID(0); p < PodID(npods); p++ {
				if cands == nil || slices.Contains(cands, p) {
					pods = append(pods, p)
				}
			}
			query := keys
			if rng.IntN(4) == 0 {
				query = keys[:rng.IntN(len(keys))+1]
			}
			want := refScore(f.ref, 0, query, pods, w)
			if len(want) > 0 {
				nonEmpty++
			}
			if len(want) > 1 {
				multi++
			}
			for name, s := range map[string]*Scorer{"fused": fused, "generic": generic} {
				var res ScoreResult
				if err := s.Score(ctx, 0, query, cands, &res); err != nil {
					t.Fatal(err)
				}
				if res.TotalBlocks != len(query) || !samePodScores(res.Pods, want) {
					t.Fatalf("seed %d query %d, %s path (candidates %v):\n got  %v\n want %v", seed, q, name, cands, res.Pods, want)
				}
			}
			// change the fleet a little before the next query: one pod
			// gains or loses a block, a tier copy, or is cleared
			p := PodID(rng.IntN(npods))
			lo := rng.IntN(len(keys))
			k := keys[lo:min(len(keys), lo+1+rng.IntN(2))]
			switch rng.IntN(5) {
			case 0, 1:
				f.remove(0, p, event.TierGPU, k)
			case 2, 3:
				f.add(0, p, event.Tier(rng.IntN(int(event.NumStoredTiers))), k)
			default:
				f.clear(p)
			}
		}
	}
	// equal empty or single-pod results would prove little
	if nonEmpty < seeds*6*3/4 || multi < seeds*6/2 {
		t.Fatalf("weak fixtures: %d non-empty, %d multi-pod results of %d", nonEmpty, multi, seeds*6)
	}
}

// TestScorerDifferentialConcurrent scores while writers churn other pods on
// the same keys (chunks change size class, move and are rewritten; pods are
// cleared; tables grow). Pods that no writer touches must score exactly as
// the reference says on every query, through both paths; the churning pods'
// scores must at least be possible. Run with -race to check the lock-free
// reads.
func TestScorerDifferentialConcurrent(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(8, 14))
	f := &fleetBuilder{t: t, idx: NewMemoryIndex(MemoryConfig{}), ref: &refIndex{holders: map[refKey]map[Holder]bool{}}}
	const stable, churn, nkeys = 40, 24, 256
	keys := make([]blockkeys.Key, nkeys)
	for i := range keys {
		keys[i] = blockkeys.Key(rng.Uint64())
	}
	randomPrefixFleet(f, rng, keys, stable)
	w := DefaultTierWeights()
	stablePods := make([]PodID, stable)
	for i := range stablePods {
		stablePods[i] = PodID(i)
	}
	want := refScore(f.ref, 0, keys, stablePods, w)
	if len(want) < stable/2 {
		t.Fatalf("weak fixture: %d stable pods score", len(want))
	}
	rounds := 3000
	if testing.Short() || race.Enabled {
		rounds = 800
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for wr := 0; wr < 2; wr++ {
		wg.Add(1)
		go func(wr int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(wr), 15))
			for r := 0; r < rounds; r++ {
				p := PodID(stable + wr*churn/2 + rng.IntN(churn/2))
				lo := rng.IntN(nkeys)
				ks := keys[lo : lo+rng.IntN(nkeys-lo+1)]
				tier := event.Tier(rng.IntN(2))
				var err error
				switch rng.IntN(10) {
				case 0:
					err = f.idx.ClearPod(ctx, p)
				case 1, 2, 3:
					err = f.idx.Remove(ctx, 0, p, tier, ks)
				default:
					err = f.idx.Add(ctx, 0, p, tier, ks)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(wr)
	}
	var rwg sync.WaitGroup
	for _, generic := range []bool{false, true} {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			var s *Scorer
			if generic {
				s = NewScorer(visitorOnly{f.idx}, nil, w)
			} else {
				s = NewScorer(f.idx, f.idx, w)
			}
			var res ScoreResult
			for q := 0; ; q++ {
				select {
				case <-stop:
					return
				default:
				}
				var cands []PodID
				if q%3 == 1 {
					cands = stablePods
				}
				if err := s.Score(ctx, 0, keys, cands, &res); err != nil {
					errs <- err
					return
				}
				var got []PodScore
				for _, ps := range res.Pods {
					if ps.Pod < stable {
						got = append(got, ps)
						continue
					}
					var sum int32
					for _, n := range ps.TierBlocks {
						sum += n
					}
					if cands != nil || ps.Pod >= stable+churn || ps.MatchedBlocks > nkeys || int(sum) != ps.MatchedBlocks || ps.TierBlocks[event.TierDisk]+ps.TierBlocks[event.TierExternal] != 0 {
						errs <- fmt.Errorf("impossible score %+v (candidates %v)", ps, cands)
						return
					}
				}
				if !samePodScores(got, want) {
					errs <- fmt.Errorf("generic=%v: stable pods scored\n %v\nwant\n %v", generic, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
