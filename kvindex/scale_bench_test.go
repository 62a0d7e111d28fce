//go:build unix

package kvindex

import (
	"context"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The benchmarks here measure how the index scales with cores: run them
// with -cpu 1,2 (more where there are cores). Each reports cpu-ns/op, the
// process's CPU time per op (all threads, GC included), next to the wall
// ns/op: on a shared machine wall time counts other processes' turns, CPU
// time does not. Perfect scaling keeps cpu-ns/op flat while ns/op falls
// with the core count.

// processCPU is the process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reports process CPU per op from the timer reset to its stop.
type cpuMeter struct{ c0 time.Duration }

func startCPU(b *testing.B) *cpuMeter {
	b.ResetTimer()
	return &cpuMeter{c0: processCPU()}
}

func (m *cpuMeter) stop(b *testing.B, perOp float64, unit string) {
	b.StopTimer()
	cpu := processCPU() - m.c0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	if unit != "" {
		b.ReportMetric(perOp*float64(b.N)/b.Elapsed().Seconds(), unit)
		b.ReportMetric(perOp*float64(b.N)/cpu.Seconds(), unit[:len(unit)-2]+"/cpu-s")
	}
}

// BenchmarkScore512x8Parallel is BenchmarkScore512x8 (warm caches) from
// GOMAXPROCS goroutines at once: reads take no lock, so throughput should
// grow with cores until memory bandwidth or shared caches limit it.
func BenchmarkScore512x8Parallel(b *testing.B) {
	idx, keys := scoreFixture(b, 8, 1)
	s := NewScorer(idx, idx, DefaultTierWeights())
	m := startCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		var res ScoreResult
		for pb.Next() {
			if err := s.Score(context.Background(), 0, keys, nil, &res); err != nil || len(res.Pods) != 8 {
				b.Errorf("score: %v %v", err, res.Pods)
				return
			}
		}
	})
	m.stop(b, 1, "scores/s")
}

// BenchmarkScore512x8ColdParallel is BenchmarkScore512x8Cold (1024 prompts
// in rotation, mostly cache misses) from GOMAXPROCS goroutines.
func BenchmarkScore512x8ColdParallel(b *testing.B) {
	idx, prompts := coldFixture()
	s := NewScorer(idx, idx, DefaultTierWeights())
	var next atomic.Int64
	m := startCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		var res ScoreResult
		n := int(next.Add(1)) * 131 // goroutines start at different prompts
		for pb.Next() {
			if err := s.Score(context.Background(), 0, prompts[n*7919%len(prompts)], nil, &res); err != nil || len(res.Pods) != 8 {
				b.Errorf("score: %v %v", err, res.Pods)
				return
			}
			n++
		}
	})
	m.stop(b, 1, "scores/s")
}

// BenchmarkMemoryAddParallel is BenchmarkMemoryAdd with one goroutine per
// pod, as the event workers apply different pods' streams: each op stores
// 16 new keys for the goroutine's pod and removes those it stored 8192 ops
// earlier. Pods store disjoint keys (the worst case for sharing, the best
// for lock contention: writers meet only on a shard lock when their keys
// land in the same one of the 64 shards). keys/s counts stored and
// removed keys.
func BenchmarkMemoryAddParallel(b *testing.B) {
	const batch, window = 16, 8192
	idx := NewMemoryIndex(MemoryConfig{Capacity: 16 << 20})
	ctx := context.Background()
	var nextPod atomic.Int64
	fill := func(pod PodID, n int, keys []blockkeys.Key) []blockkeys.Key {
		for j := range keys {
			keys[j] = benchKey(uint64(pod)<<40 | uint64(n*batch+j))
		}
		return keys
	}
	// steady state for the GOMAXPROCS pods RunParallel will use
	keys := make([]blockkeys.Key, batch)
	for p := range runtime.GOMAXPROCS(0) {
		for n := range window {
			_ = idx.Add(ctx, 0, PodID(p), event.TierGPU, fill(PodID(p), n, keys))
		}
	}
	m := startCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		pod := PodID(nextPod.Add(1) - 1)
		if pod >= 64 {
			b.Error("more than 64 goroutines")
			return
		}
		keys := make([]blockkeys.Key, batch)
		for n := window; pb.Next(); n++ {
			if err := idx.Add(ctx, 0, pod, event.TierGPU, fill(pod, n, keys)); err != nil {
				b.Error(err)
				return
			}
			if err := idx.Remove(ctx, 0, pod, event.TierGPU, fill(pod, n-window, keys)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	m.stop(b, 2*batch, "keys/s")
}
