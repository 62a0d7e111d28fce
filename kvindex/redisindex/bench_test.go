package redisindex

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

const benchModel = "meta-llama/Llama-3.1-8B-Instruct"

func benchPod(i int) string { return fmt.Sprintf("vllm-llama-7f9c4-%02d", i) }

// benchIndex builds an index with a round-trip counter attached.
func benchIndex(b *testing.B, url string, walk ...bool) (*Index, *kvindex.Interner, *redistest.RoundTrips) {
	return newCountedIndex(b, url, func(c *Config) { c.ServerWalk = len(walk) > 0 && walk[0] })
}

// fillPrefixes: pod i holds the first step*(i+1) of 512 blocks.
func fillPrefixes(b *testing.B, idx kvindex.Index, in *kvindex.Interner, step int) (kvindex.ModelID, []blockkeys.Key) {
	ctx := context.Background()
	m := in.Model(benchModel)
	keys := seqKeys(512, 0x9e3779b97f4a7c15)
	for p := range 8 {
		if err := idx.Add(ctx, m, in.Pod(benchPod(p), 0), event.TierGPU, keys[:step*(p+1)]); err != nil {
			b.Fatal(err)
		}
	}
	return m, keys
}

// BenchmarkScore512x8 is score latency through kvindex.Scorer for 512 keys
// and 8 pods: memory vs Redis (single node, 3-master cluster).
func BenchmarkScore512x8(b *testing.B) { benchScore(b, 64) }

// BenchmarkScore512x8Miss: the same 512-key prompt, but the pods hold only
// its first 4..32 blocks (a prompt that is mostly new).
func BenchmarkScore512x8Miss(b *testing.B) { benchScore(b, 4) }

func benchScore(b *testing.B, step int) {
	run := func(b *testing.B, idx kvindex.Index, in *kvindex.Interner, rt *redistest.RoundTrips, nodes ...*redistest.Server) {
		m, keys := fillPrefixes(b, idx, in, step)
		sc := kvindex.NewScorer(idx, nil, kvindex.DefaultTierWeights())
		var res kvindex.ScoreResult
		ctx := context.Background()
		if err := sc.Score(ctx, m, keys, nil, &res); err != nil || len(res.Pods) != 8 {
			b.Fatalf("warm-up: %v %d pods", err, len(res.Pods))
		}
		if rt != nil {
			rt.Reset()
		}
		cpu := startCPU(b, nodes)
		b.ResetTimer()
		for b.Loop() {
			if err := sc.Score(ctx, m, keys, nil, &res); err != nil {
				b.Fatal(err)
			}
		}
		cpu.report(b, b.N)
		if rt != nil {
			b.ReportMetric(float64(rt.Load())/float64(b.N), "roundtrips/op")
		}
	}
	b.Run("memory", func(b *testing.B) {
		in := kvindex.NewInterner()
		run(b, kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), in, nil)
	})
	b.Run("redis", func(b *testing.B) {
		s := redistest.Start(b)
		idx, in, rt := benchIndex(b, s.URL())
		run(b, idx, in, rt, s)
	})
	b.Run("redis-server-walk", func(b *testing.B) {
		s := redistest.Start(b)
		idx, in, rt := benchIndex(b, s.URL(), true)
		run(b, idx, in, rt, s)
	})
	b.Run("redis-cluster3", func(b *testing.B) {
		c := redistest.StartCluster(b, 3)
		idx, in, rt := benchIndex(b, c.URL())
		run(b, idx, in, rt, c.Nodes...)
	})
}

// BenchmarkApply is write throughput: Add of 64-key batches (a typical
// BlockStored event of a long prompt) from 8 concurrent pods, reported as
// block keys per second.
func BenchmarkApply(b *testing.B) {
	run := func(b *testing.B, url string, nodes ...*redistest.Server) {
		idx, in, rt := benchIndex(b, url)
		m := in.Model(benchModel)
		var next atomic.Uint64
		var podSeq atomic.Int32
		ctx := context.Background()
		rt.Reset()
		w0 := idx.WriteStats()
		cpu := startCPU(b, nodes)
		start := time.Now()
		b.SetParallelism(4) // 8 writers on 2 cores: the daemon's per-pod workers
		b.RunParallel(func(pb *testing.PB) {
			p := in.Pod(benchPod(int(podSeq.Add(1))), 0)
			keys := make([]blockkeys.Key, 64)
			for pb.Next() {
				base := next.Add(64)
				for i := range keys {
					keys[i] = blockkeys.Key(base + uint64(i))
				}
				if err := idx.Add(ctx, m, p, event.TierGPU, keys); err != nil {
					b.Fatal(err)
				}
			}
		})
		el := time.Since(start)
		b.ReportMetric(float64(b.N*64)/el.Seconds(), "keys/s")
		cpu.reportPerKey(b, b.N*64)
		b.ReportMetric(float64(rt.Load())/float64(b.N), "roundtrips/op")
		w := idx.WriteStats()
		if f := w.Flushes - w0.Flushes; f > 0 {
			b.ReportMetric(float64(w.Requests-w0.Requests)/float64(f), "adds/flush")
		}
	}
	b.Run("redis", func(b *testing.B) {
		s := redistest.Start(b)
		run(b, s.URL(), s)
	})
	b.Run("redis-cluster3", func(b *testing.B) {
		c := redistest.StartCluster(b, 3)
		run(b, c.URL(), c.Nodes...)
	})
}

// BenchmarkBytesPerEntry measures Redis memory (INFO memory used_memory
// before/after) for 1M (block, pod) entries, in two shapes: 125k blocks
// each held by 8 pods, and 1M blocks each held by one pod. Run with
// -benchtime=1x; the work does not depend on b.N.
func BenchmarkBytesPerEntry(b *testing.B) {
	for _, shape := range []struct {
		name       string
		blocks     int
		podsPerKey int
	}{{"125kx8pods", 125_000, 8}, {"1Mx1pod", 1_000_000, 1}} {
		b.Run(shape.name, func(b *testing.B) {
			for b.Loop() {
				s := redistest.Start(b)
				in := kvindex.NewInterner()
				idx, err := New(context.Background(), Config{URL: s.URL(), Namespace: "kvindex", Interner: in, StatsRefresh: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				m := in.Model(benchModel)
				_ = idx.Add(ctx, m, in.Pod(benchPod(0), 0), 0, seqKeys(1, 1<<62)) // scripts + pods hash exist before "before"
				before := usedMemory(b, s)
				const batch = 1000
				keys := make([]blockkeys.Key, batch)
				for p := range shape.podsPerKey {
					pod := in.Pod(benchPod(p), 0)
					for off := 0; off < shape.blocks; off += batch {
						for i := range keys {
							keys[i] = blockkeys.Key(uint64(off+i)*0x9e3779b97f4a7c15 + 1)
						}
						if err := idx.Add(ctx, m, pod, event.TierGPU, keys); err != nil {
							b.Fatal(err)
						}
					}
				}
				after := usedMemory(b, s)
				entries := shape.blocks * shape.podsPerKey
				b.ReportMetric(float64(after-before)/float64(entries), "bytes/entry")
				b.ReportMetric(float64(after-before)/float64(shape.blocks), "bytes/key")
				idx.Close()
			}
		})
	}
}

func usedMemory(b *testing.B, s *redistest.Server) int64 {
	v, err := s.InfoField("memory", "used_memory")
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkPodListing: the block counts of 64 pods, as /v1/pods needs them,
// one PodBlocks per pod versus one PodBlocksBatch (one HMGET).
func BenchmarkPodListing(b *testing.B) {
	s := redistest.Start(b)
	idx, in, rt := benchIndex(b, s.URL())
	ctx := context.Background()
	m := in.Model(benchModel)
	pods := make([]kvindex.PodID, 64)
	for i := range pods {
		pods[i] = in.Pod(benchPod(i), 0)
		if err := idx.Add(ctx, m, pods[i], event.TierGPU, seqKeys(4, uint64(i)<<8)); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]int64, len(pods))
	b.Run("one-by-one", func(b *testing.B) {
		rt.Reset()
		for b.Loop() {
			for i, p := range pods {
				n, err := idx.PodBlocks(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				out[i] = n
			}
		}
		b.ReportMetric(float64(rt.Load())/float64(b.N), "roundtrips/op")
	})
	b.Run("batch", func(b *testing.B) {
		rt.Reset()
		for b.Loop() {
			if err := idx.PodBlocksBatch(ctx, pods, out); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(rt.Load())/float64(b.N), "roundtrips/op")
	})
}

// cpuMeter measures CPU time rather than wall time: on a loaded shared
// machine wall-clock ns/op mostly measures waiting to be scheduled. It
// reads this process' CPU (getrusage: client, GC and background work) and
// every redis-server's own (INFO cpu used_cpu_user + used_cpu_sys).
type cpuMeter struct {
	nodes          []*redistest.Server
	client, server time.Duration
}

func startCPU(b *testing.B, nodes []*redistest.Server) *cpuMeter {
	return &cpuMeter{nodes: nodes, client: processCPU(b), server: serversCPU(b, nodes)}
}

func (c *cpuMeter) deltas(b *testing.B) (client, server time.Duration) {
	return processCPU(b) - c.client, serversCPU(b, c.nodes) - c.server
}

// report adds client-cpu-us/op and server-cpu-us/op.
func (c *cpuMeter) report(b *testing.B, n int) {
	cl, sv := c.deltas(b)
	b.ReportMetric(float64(cl.Microseconds())/float64(n), "client-cpu-us/op")
	if len(c.nodes) > 0 {
		b.ReportMetric(float64(sv.Microseconds())/float64(n), "server-cpu-us/op")
	}
}

// reportPerKey adds the CPU time per written key, client and server.
func (c *cpuMeter) reportPerKey(b *testing.B, keys int) {
	cl, sv := c.deltas(b)
	b.ReportMetric(float64(cl.Nanoseconds())/float64(keys), "client-cpu-ns/key")
	if len(c.nodes) > 0 {
		b.ReportMetric(float64(sv.Nanoseconds())/float64(keys), "server-cpu-ns/key")
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func serversCPU(b *testing.B, nodes []*redistest.Server) time.Duration {
	var sum time.Duration
	for _, s := range nodes {
		for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
			v, err := s.InfoField("cpu", f)
			if err != nil {
				b.Fatal(err)
			}
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += time.Duration(sec * float64(time.Second))
		}
	}
	return sum
}
