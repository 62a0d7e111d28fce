package applier

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// nopIndex measures the applier alone.
type nopIndex struct{}

func (nopIndex) Add(context.Context, kvindex.ModelID, kvindex.PodID, event.Tier, []blockkeys.Key) error {
	return nil
}
func (nopIndex) Remove(context.Context, kvindex.ModelID, kvindex.PodID, event.Tier, []blockkeys.Key) error {
	return nil
}
func (nopIndex) ClearPod(context.Context, kvindex.PodID) error { return nil }
func (nopIndex) Lookup(context.Context, kvindex.ModelID, []blockkeys.Key, kvindex.Visitor) error {
	return nil
}
func (nopIndex) PodBlocks(context.Context, kvindex.PodID) (int64, error) { return 0, nil }
func (nopIndex) Stats() kvindex.IndexStats                               { return kvindex.IndexStats{} }

// applierBenchBatches precomputes batches of one BlockStored of 16 blocks of
// 16 tokens each, chained, as an engine with cfg would publish them.
func applierBenchBatches(b *testing.B, cfg blockkeys.KeyConfig, engineCfg blockkeys.KeyConfig, nBatches int) []event.Batch {
	toks := make([]uint32, nBatches*16*16)
	for i := range toks {
		toks[i] = uint32(i*7919) % 151936
	}
	eh := engineKeys(&testing.T{}, engineCfg, toks, blockkeys.RequestExtras{})
	out := make([]event.Batch, nBatches)
	for i := range out {
		ev := stored(eh, toks, 16, i*16, (i+1)*16)
		out[i] = event.Batch{Pod: "p", Model: "m", Events: []event.Event{ev}}
	}
	return out
}

// BenchmarkApplierApply reports blocks/s through Apply (parity check
// included) for a matching pod, a mismatching pod (alias path), and a pod
// whose events carry no token ids (nothing to verify).
func BenchmarkApplierApply(b *testing.B) {
	cfg := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "0", BlockSize: 16}
	other := cfg
	other.Seed = "1"
	for _, idxName := range []string{"nop", "memory"} {
		for _, c := range []struct {
			name     string
			engine   blockkeys.KeyConfig
			noTokens bool
		}{{"match", cfg, false}, {"mismatch", other, false}, {"no-tokens", cfg, true}} {
			b.Run(fmt.Sprintf("%s/%s", idxName, c.name), func(b *testing.B) {
				var idx kvindex.Index = nopIndex{}
				if idxName == "memory" {
					idx = kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: 1 << 22})
				}
				hs, _ := blockkeys.NewHasherSet(cfg, nil)
				a, err := New(Config{Index: idx, Interner: kvindex.NewInterner(), Hashers: hs, DigestCacheSize: 1 << 16, AliasCacheSize: 1 << 16})
				if err != nil {
					b.Fatal(err)
				}
				batches := applierBenchBatches(b, cfg, c.engine, 256)
				if c.noTokens {
					for i := range batches {
						batches[i].Events[0].TokenIDs = nil
						batches[i].Events[0].BlockSize = 0
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				blocks := 0
				for i := 0; i < b.N; i++ {
					bt := &batches[i%len(batches)]
					a.Apply(context.Background(), bt)
					blocks += len(bt.Events[0].BlockHashes)
				}
				b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}
