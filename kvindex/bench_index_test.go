package kvindex

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// benchKey derives well-spread synthetic keys (engine keys are digests).
func benchKey(i uint64) blockkeys.Key {
	x := i + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return blockkeys.Key(x ^ x>>31)
}

// BenchmarkMemoryAdd measures the apply path in an engine's steady state:
// each op stores a BlockStored batch of 16 new keys (a 256-token chunk at
// block size 16) for one of 8 pods, where pairs of pods store the same
// prefixes, and removes the batch that pod stored 8192 ops earlier, as the
// engine evicts old blocks; about 1M entries stay resident. keys/s counts
// applied keys, stored and removed.
func BenchmarkMemoryAdd(b *testing.B) {
	const batch, window = 16, 8192
	idx := NewMemoryIndex(MemoryConfig{})
	ctx := context.Background()
	keys := make([]blockkeys.Key, batch)
	batchKeys := func(n int) []blockkeys.Key {
		base := uint64(n/2) * batch // ops 2k and 2k+1 (two pods) share keys
		for j := range keys {
			keys[j] = benchKey(base + uint64(j))
		}
		return keys
	}
	for n := 0; n < window; n++ { // fill to steady state
		_ = idx.Add(ctx, 0, PodID(n%8), event.TierGPU, batchKeys(n))
	}
	b.ResetTimer()
	for n := window; n < window+b.N; n++ {
		if err := idx.Add(ctx, 0, PodID(n%8), event.TierGPU, batchKeys(n)); err != nil {
			b.Fatal(err)
		}
		if err := idx.Remove(ctx, 0, PodID(n%8), event.TierGPU, batchKeys(n-window)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*2*batch)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkMemoryAddEvicting is the apply path when removals are lost and
// the capacity bound (1M entries) does the evicting: every new entry costs
// a CLOCK sweep step.
func BenchmarkMemoryAddEvicting(b *testing.B) {
	const batch = 16
	idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	ctx := context.Background()
	keys := make([]blockkeys.Key, batch)
	add := func(n int) {
		base := uint64(n/2) * batch
		for j := range keys {
			keys[j] = benchKey(base + uint64(j))
		}
		if err := idx.Add(ctx, 0, PodID(n%8), event.TierGPU, keys); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	for ; idx.Stats().Evictions == 0; n++ { // fill to the bound
		add(n)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		add(n + i)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "keys/s")
}

// scoreFixture builds an index where npods pods share one 512-block prefix
// but hold runs of different lengths, ending bunch pods at a time (pod p
// holds the first 512*(p/bunch+1)/(npods/bunch) blocks, so the last pods
// hold all of them and the lookup walks all 512 keys), some blocks also on
// CPU, plus 200k unrelated entries so the tables have a realistic size.
func scoreFixture(b *testing.B, npods, bunch int) (*MemoryIndex, []blockkeys.Key) {
	idx := NewMemoryIndex(MemoryConfig{})
	ctx := context.Background()
	keys := make([]blockkeys.Key, 512)
	for i := range keys {
		keys[i] = benchKey(uint64(i))
	}
	for p := 0; p < npods; p++ {
		n := 512 * (p/bunch + 1) / (npods / bunch)
		if err := idx.Add(ctx, 0, PodID(p), event.TierGPU, keys[:n]); err != nil {
			b.Fatal(err)
		}
		if p%4 == 0 { // an offloaded copy of part of the prefix
			if err := idx.Add(ctx, 0, PodID(p), event.TierCPU, keys[:n/2]); err != nil {
				b.Fatal(err)
			}
		}
	}
	other := make([]blockkeys.Key, 1000)
	for r := 0; r < 200; r++ {
		for i := range other {
			other[i] = benchKey(1<<40 + uint64(r*1000+i))
		}
		if err := idx.Add(ctx, 0, PodID(r%npods), event.TierGPU, other); err != nil {
			b.Fatal(err)
		}
	}
	return idx, keys
}

func benchmarkScore(b *testing.B, npods, bunch int) {
	idx, keys := scoreFixture(b, npods, bunch)
	s := NewScorer(idx, idx, DefaultTierWeights())
	ctx := context.Background()
	var res ScoreResult
	if err := s.Score(ctx, 0, keys, nil, &res); err != nil {
		b.Fatal(err)
	}
	if len(res.Pods) != npods || res.Pods[0].MatchedBlocks != 512 {
		b.Fatalf("fixture broken: %d pods, best %+v", len(res.Pods), res.Pods[0])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if err := s.Score(ctx, 0, keys, nil, &res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScore512x8 and BenchmarkScore512x64: index lookup + scoring of a
// 512-block request (8k tokens at block size 16), no transport.
func BenchmarkScore512x8(b *testing.B)  { benchmarkScore(b, 8, 1) }
func BenchmarkScore512x64(b *testing.B) { benchmarkScore(b, 64, 1) }

// BenchmarkScore512x64Bunched is BenchmarkScore512x64 with pods ending
// their runs four at a time: holder sets then change by several holders
// per step, which the fused scorer handles by a full diff instead of
// patching one holder.
func BenchmarkScore512x64Bunched(b *testing.B) { benchmarkScore(b, 64, 4) }

// coldFixture holds 1024 different 512-block prompts, each a prefix of
// which 8 pods hold (pod p the first 64*(p+1) blocks): 512k keys, far more
// than the caches hold. Built once, it is shared by the runs of
// BenchmarkScore512x8Cold.
var coldFixture = sync.OnceValues(func() (*MemoryIndex, [][]blockkeys.Key) {
	const prompts, npods = 1024, 8
	idx := NewMemoryIndex(MemoryConfig{Capacity: 16 << 20})
	ctx := context.Background()
	keys := make([][]blockkeys.Key, prompts)
	for q := range keys {
		keys[q] = make([]blockkeys.Key, 512)
		for i := range keys[q] {
			keys[q][i] = benchKey(uint64(q)<<20 | uint64(i))
		}
		for p := 0; p < npods; p++ {
			_ = idx.Add(ctx, 0, PodID(p), event.TierGPU, keys[q][:512*(p+1)/npods])
		}
	}
	return idx, keys
})

// BenchmarkScore512x8Cold is BenchmarkScore512x8 with each call scoring a
// different prompt, so the slots and chunks it reads are mostly not in
// cache: it measures how well the lookups' cache misses overlap.
func BenchmarkScore512x8Cold(b *testing.B) {
	idx, prompts := coldFixture()
	if st := idx.Stats(); st.Evictions != 0 || st.Keys != 1024*512 {
		b.Fatalf("fixture broken: %+v", st)
	}
	s := NewScorer(idx, idx, DefaultTierWeights())
	ctx := context.Background()
	var res ScoreResult
	if err := s.Score(ctx, 0, prompts[0], nil, &res); err != nil || len(res.Pods) != 8 {
		b.Fatalf("fixture broken: %v %v", err, res.Pods)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		// a stride coprime to the prompt count visits every prompt
		if err := s.Score(ctx, 0, prompts[n*7919%len(prompts)], nil, &res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBytesPerEntry measures heap bytes per live (block, pod) entry for
// 1M entries over 8 pods.
//
// "shared" is prefix sharing as prefix-aware routing leaves it: 16 system
// prompts of 32 blocks end up on every pod, each conversation adds 64 blocks
// of its own on one pod (a quarter of them also on a second pod, after a
// load-balancing reroute). "unshared" is the worst case, every block on one
// pod only: then each entry also carries a whole key slot.
func BenchmarkBytesPerEntry(b *testing.B) {
	b.Run("shared", func(b *testing.B) { benchmarkBytesPerEntry(b, true) })
	b.Run("unshared", func(b *testing.B) { benchmarkBytesPerEntry(b, false) })
}

func benchmarkBytesPerEntry(b *testing.B, shared bool) {
	const target = 1 << 20
	ctx := context.Background()
	var perEntry, holdersPerKey float64
	for n := 0; n < b.N; n++ {
		rng := rand.New(rand.NewPCG(1, 2))
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		idx := NewMemoryIndex(MemoryConfig{Capacity: 2 * target})
		sys := make([]blockkeys.Key, 32)
		conv := make([]blockkeys.Key, 64)
		next := uint64(1 << 32)
		for idx.Stats().Entries < target {
			for i := range conv {
				conv[i] = benchKey(next)
				next++
			}
			pod := PodID(rng.IntN(8))
			if !shared {
				_ = idx.Add(ctx, 0, pod, event.TierGPU, conv)
				continue
			}
			sp := rng.IntN(16)
			for i := range sys {
				sys[i] = benchKey(uint64(sp*32 + i))
			}
			_ = idx.Add(ctx, 0, pod, event.TierGPU, sys)
			_ = idx.Add(ctx, 0, pod, event.TierGPU, conv)
			if rng.IntN(4) == 0 {
				pod2 := PodID((int(pod) + 1 + rng.IntN(7)) % 8)
				_ = idx.Add(ctx, 0, pod2, event.TierGPU, sys)
				_ = idx.Add(ctx, 0, pod2, event.TierGPU, conv)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := idx.Stats()
		perEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(st.Entries)
		holdersPerKey = float64(st.Entries) / float64(st.Keys)
		runtime.KeepAlive(idx)
	}
	b.ReportMetric(perEntry, "B/entry")
	b.ReportMetric(holdersPerKey, "holders/key")
}
