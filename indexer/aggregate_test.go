package indexer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/kvindex"
)

// TestAggregateOnePerPodMatchesGrouping checks the one-rank-per-pod order
// (small keys, names by their precomputed order) against the general
// grouping, on answers full of ties and with pods interned out of name order,
// in the scorer's order and in none.
func TestAggregateOnePerPodMatchesGrouping(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	in := kvindex.NewInterner()
	var ids []kvindex.PodID
	for _, i := range rng.Perm(300) {
		ids = append(ids, in.Pod(fmt.Sprintf("pod-%d", i), 0))
	}
	var order nameOrder
	all := func(kvindex.PodID) bool { return true }
	for trial := 0; trial < 200; trial++ {
		var fast, slow Result
		fast.BlockSize, slow.BlockSize = 16, 16
		for _, j := range rng.Perm(len(ids))[:rng.IntN(len(ids))] {
			blocks := 1 + rng.IntN(3)
			ps := kvindex.PodScore{Pod: ids[j], MatchedBlocks: blocks, Score: float64(blocks) * []float64{1, 0.5}[rng.IntN(2)]}
			ps.TierBlocks[0] = int32(blocks)
			fast.res.Pods = append(fast.res.Pods, ps)
		}
		if trial%2 == 0 { // the scorer's order (long and short runs of ties), else any order
			slices.SortFunc(fast.res.Pods, kvindex.ComparePodScores)
		}
		slow.res.Pods = fast.res.Pods
		fast.aggregate(in, all, &order)
		// the general path, as aggregate prepares it
		for _, ps := range slow.res.Pods {
			name, rank := in.PodName(ps.Pod)
			e := rankEntry{pod: len(slow.names), RankScore: RankScore{DPRank: rank, MatchedBlocks: ps.MatchedBlocks, Score: ps.Score}}
			copy(e.Tiers[:], ps.TierBlocks[:])
			slow.entries = append(slow.entries, e)
			slow.names = append(slow.names, name)
		}
		slow.aggregateRanks(16)
		if len(fast.Pods) != len(slow.Pods) || (len(fast.Pods) > 0 && !reflect.DeepEqual(fast.Pods, slow.Pods)) {
			t.Fatalf("trial %d: one-per-pod order\n%+v\ngrouping\n%+v", trial, fast.Pods, slow.Pods)
		}
	}
}
