package indexer

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// BenchmarkApplyWithPrediction compares the apply path (memory index,
// parity check on) without the prediction check, with it on but nothing
// awaited, and with a full table of awaited keys that never arrive (every
// stored block is looked up). Compare blocks/s across the three.
func BenchmarkApplyWithPrediction(b *testing.B) {
	const blocksPerEvent, nBatches = 16, 512
	tokens := seqTokens(1, nBatches*blocksPerEvent*testBlock)
	hashes := blockHashes(tokens, blockkeys.RequestExtras{})
	batches := make([]event.Batch, nBatches)
	for i := range batches {
		lo, hi := i*blocksPerEvent, (i+1)*blocksPerEvent
		ev := event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: tokens[lo*testBlock : hi*testBlock],
			BlockHashes: hashes[lo:hi]}
		if i > 0 {
			ev.HasParent, ev.ParentHash = true, hashes[lo-1]
		}
		batches[i] = event.Batch{Pod: "pod-a", Model: testModel, Events: []event.Event{ev}}
	}
	for _, c := range []struct {
		name     string
		rate     float64
		awaiting bool
	}{{"off", 0, false}, {"on-idle", 1, false}, {"on-awaiting", 1, true}} {
		b.Run(c.name, func(b *testing.B) {
			ix := newTestIndexer(b, Config{Index: IndexConfig{Capacity: 1 << 22}, Prediction: PredictionConfig{SampleRate: c.rate, Window: time.Hour}})
			if c.awaiting {
				apply(ix, "pod-a", 0, batches[0].Events...) // the model becomes known
				var r Result
				for i := range 1000 {
					q := Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1<<24+i*64*testBlock, 64*testBlock)}
					if err := ix.Score(context.Background(), &q, &r); err != nil {
						b.Fatal(err)
					}
				}
				if ix.pred.awaiting.Load() < 60000 {
					b.Fatalf("only %d keys awaited", ix.pred.awaiting.Load())
				}
			}
			sink := ix.Sink()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sink.Apply(context.Background(), &batches[i%nBatches])
			}
			b.ReportMetric(float64(b.N*blocksPerEvent)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkPredictionObserve is the hook alone for a 16-block Add while
// ~64k keys are awaited: its ns/block is what the apply path pays per
// stored block when the table is full.
func BenchmarkPredictionObserve(b *testing.B) {
	ix := newTestIndexer(b, Config{Prediction: PredictionConfig{SampleRate: 1, Window: time.Hour}})
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, testBlock), 1, event.TierGPU))
	var r Result
	for i := range 1000 {
		q := Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1<<24+i*64*testBlock, 64*testBlock)}
		if err := ix.Score(context.Background(), &q, &r); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([]blockkeys.Key, 16)
	for i := range keys {
		keys[i] = blockkeys.Key(i*7919 + 3)
	}
	model, _ := ix.in.LookupModel(testModel)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ix.pred.observe(model, keys)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/block")
}
