package indexer

import (
	"context"
	"fmt"
	"github.com/kvindex/kvindex/internal/testkit/cputime"
	"runtime"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

// pickBench is 64 pods holding prefixes of one 512-block prompt (pod i holds
// 512 - 8*i blocks), 64 candidates with varied load, and the Score query of
// the same request.
func pickBench(b *testing.B) (*Indexer, *PickQuery, *Query) {
	ix := newTestIndexer(b, Config{})
	prompt := seqTokens(7, 512*testBlock)
	q := &PickQuery{Query: Query{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})}}
	for p := 0; p < 64; p++ {
		name := fmt.Sprintf("pod-%02d", p)
		apply(ix, name, 0, storeEvent(prompt, 512-p*8, event.TierGPU))
		q.Candidates = append(q.Candidates, Candidate{Pod: name, Load: routing.Load{Running: p % 5, Waiting: p % 3, KVUsage: float64(p) / 64}})
	}
	sq := q.Query
	for _, c := range q.Candidates {
		sq.Pods = append(sq.Pods, c.Pod)
	}
	return ix, q, &sq
}

// BenchmarkPick512x64 is Pick of 512 block hashes over 64 candidates, with
// the default policy, speculative entries and routing history on.
func BenchmarkPick512x64(b *testing.B) {
	ix, q, _ := pickBench(b)
	var r PickResult
	b.ReportAllocs()
	for b.Loop() {
		if err := ix.Pick(context.Background(), q, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPick512x64Speculative is the same with the chosen pod missing
// the last blocks, so every pick reads and writes speculative entries.
func BenchmarkPick512x64Speculative(b *testing.B) {
	ix, q, _ := pickBench(b)
	// the full holder is busy: under the cost policy pod-01 (504 blocks)
	// wins and is assumed to hold the last 8 (the default sglang policy
	// keeps a prefix that long on its holder at this imbalance)
	q.Candidates[0].Running = 40
	q.Policy = routing.NameCost
	var r PickResult
	// One pick writes the entries every later one reads (so that the check
	// below holds at any -benchtime, 1x included).
	if err := ix.Pick(context.Background(), q, &r); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := ix.Pick(context.Background(), q, &r); err != nil {
			b.Fatal(err)
		}
	}
	if r.Candidates[r.Chosen].SpeculativeBlocks == 0 {
		b.Fatal("no speculative blocks")
	}
}

// BenchmarkScore512x64 is Score of the same request restricted to the same
// 64 pods (pods filter), and BenchmarkScore512All without a filter.
func BenchmarkScore512x64(b *testing.B) {
	ix, _, q := pickBench(b)
	benchScore(b, ix, q)
}

func BenchmarkScore512All(b *testing.B) {
	ix, _, q := pickBench(b)
	q.Pods = nil
	benchScore(b, ix, q)
}

// BenchmarkPickVsScore512x64 runs Score (without and with the pods filter
// of the 64 candidates) and Pick of the same request, each for b.N calls on one
// locked OS thread, and reports the thread CPU time per call of each and
// their difference: comparable on a loaded machine where ns/op is not.
func BenchmarkPickVsScore512x64(b *testing.B) {
	ix, q, sq := pickBench(b)
	var r PickResult
	var sr Result
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func(f func()) float64 {
		t0, ok := cputime.Thread()
		if !ok {
			b.Skip("no per-thread CPU time on this system")
		}
		for range b.N {
			f()
		}
		t1, _ := cputime.Thread()
		return float64((t1 - t0).Nanoseconds()) / float64(b.N)
	}
	ctx := context.Background()
	all := *sq
	all.Pods = nil
	scoreAll := cpu(func() { _ = ix.Score(ctx, &all, &sr) })
	score := cpu(func() { _ = ix.Score(ctx, sq, &sr) })
	pick := cpu(func() { _ = ix.Pick(ctx, q, &r) })
	b.ReportMetric(scoreAll, "score-unfiltered-cpu-ns/op")
	b.ReportMetric(score, "score-cpu-ns/op")
	b.ReportMetric(pick, "pick-cpu-ns/op")
	b.ReportMetric(pick-score, "pick-minus-score-cpu-ns/op")
}
