package indexer

import (
	"context"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"

	"github.com/kvindex/kvindex/kvevents/event"
)

// dropRecorder is a SpeculativeStore that records Drop calls.
type dropRecorder struct {
	SpeculativeStore // Extend and Hold are not called here
	calls            int
	keys             []blockkeys.Key
	holders          [2]uint64
}

func (d *dropRecorder) Drop(_ context.Context, _ string, keys []blockkeys.Key, holders [2]uint64) error {
	d.calls++
	d.keys = append(d.keys[:0], keys...)
	d.holders = holders
	return nil
}

// A batch's events answer the speculative entries of its pod in one Drop
// (one round trip with the shared store, where it was two per event):
// every stored or removed block under the key the applier indexed it
// (here the engine's hashes: events without token ids are indexed as
// published), for the pod with and without its rank; dropping allocates
// nothing.
func TestDropAnsweredOneDropPerBatch(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	rec := &dropRecorder{}
	ix.pick.spec, ix.pick.specMem = rec, nil
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "p", DPRank: 1, Model: "m", Events: []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{1, 2}},
		{Kind: event.AllBlocksCleared},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{3}},
		{Kind: event.BlockStored, BlockHashes: []uint64{4, 5}},
	}})
	if rec.calls != 1 || !slices.Equal(rec.keys, []blockkeys.Key{1, 2, 3, 4, 5}) ||
		rec.holders != [2]uint64{holderID("p", 1), holderID("p", -1)} {
		t.Fatalf("%d Drop calls, last with %v for %v", rec.calls, rec.keys, rec.holders)
	}
	one := &event.Batch{Pod: "p", Model: "m"}
	keys := []blockkeys.Key{6}
	if n := testing.AllocsPerRun(100, func() { ix.dropAnswered(context.Background(), one, keys) }); n != 0 {
		t.Errorf("dropping allocates %v times", n)
	}
}
