//go:build unix

package kvevents

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// BenchmarkDecodeApplyParallel is BenchmarkDecodeApply with GOMAXPROCS
// engines applied at once, one goroutine per engine as the subscriber's
// workers apply streams (a stream's batches in order on one worker,
// different streams in parallel), into one shared index and applier. Each
// engine stores its own blocks. Run it with -cpu 1,2: keys/s is the
// throughput (wall), keys/cpu-s the throughput per core-second of process
// CPU time (GC included), which other processes on the machine do not
// distort; flat keys/cpu-s as -cpu grows means apply scales with cores.
func BenchmarkDecodeApplyParallel(b *testing.B) {
	decodeApplyModes(b, func(b *testing.B, withTokens bool, h *blockkeys.Hasher, hs *blockkeys.HasherSet) {
		ap, err := applier.New(applier.Config{Index: kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: 16 << 20}),
			Interner: kvindex.NewInterner(), Hashers: hs, Metrics: applier.NewMetrics(nil)})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		var next atomic.Int64
		var blocks int
		streams := make([][][]byte, runtime.GOMAXPROCS(0)) // RunParallel's goroutine count
		for e := range streams {
			streams[e], blocks = decodeApplyStreamSeed(b, h, withTokens, uint64(e)*0x9e3779b97f4a7c15+1)
			var batch event.Batch
			for i, p := range streams[e] { // warm up: index, digest cache and buffers at steady state
				if err := decodeApplyOne(ctx, ap, p, "pod-"+strconv.Itoa(e), uint64(i), &batch); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportAllocs()
		var ru0 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			e := int(next.Add(1) - 1)
			if e >= len(streams) {
				b.Error("more goroutines than prepared engines")
				return
			}
			pod := "pod-" + strconv.Itoa(e)
			payloads := streams[e]
			var batch event.Batch
			seq := uint64(len(payloads))
			for pb.Next() {
				if err := decodeApplyOne(ctx, ap, payloads[seq%uint64(len(payloads))], pod, seq, &batch); err != nil {
					b.Error(err)
					return
				}
				seq++
			}
		})
		b.StopTimer()
		var ru1 syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
		cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
		keys := float64(blocks) * float64(b.N)
		b.ReportMetric(keys/b.Elapsed().Seconds(), "keys/s")
		b.ReportMetric(keys/cpu.Seconds(), "keys/cpu-s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		for _, st := range ap.PodStats() {
			if st.IndexErrors != 0 || st.ParityMismatches != 0 || (withTokens && st.ParityMatches == 0) {
				b.Fatalf("applier did not take the batches as valid: %+v", st)
			}
		}
	})
}
