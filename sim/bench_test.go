package sim

import (
	"testing"

	"github.com/kvindex/kvindex/sim/cache"
)

// BenchmarkSimulateConversation: the whole conversation trace (12,031
// requests), 8 pods x 2000 LRU blocks, one routing policy per sub-benchmark.
func BenchmarkSimulateConversation(b *testing.B) {
	reqs, err := ReadTraceFile("testdata/mooncake/conversation_trace.jsonl.gz")
	if err != nil {
		b.Fatal(err)
	}
	cfg := FleetConfig{Pods: 8, Cache: cache.Config{Policy: "lru", Capacity: 2000}, BlockSize: 512, Speedup: 2, EventLag: 0.1,
		Service: DefaultServiceModel()}
	rp := DefaultRouterParams(8, 512, 2000)
	for _, name := range RouterOrder {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r, err := newRouter(name, rp)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := simulate(cfg, reqs, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReplayS3FIFO: seed-001 replay of the conversation trace, 4096 blocks.
func BenchmarkReplayS3FIFO(b *testing.B) {
	reqs, err := ReadTraceFile("testdata/mooncake/conversation_trace.jsonl.gz")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		c, _ := cache.NewS3FIFO(4096, 0.1, 3)
		Replay(reqs, c, 512, false)
	}
}
