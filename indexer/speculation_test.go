package indexer

import (
	"context"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// dropRecorder is a SpeculativeStore that records Drop calls.
type dropRecorder struct {
	SpeculativeStore // Extend and Hold are not called here
	calls            int
	hashes           []uint64
	holders          [2]uint64
}

func (d *dropRecorder) Drop(_ context.Context, _ string, hashes []uint64, holders [2]uint64) error {
	d.calls++
	d.hashes = append(d.hashes[:0], hashes...)
	d.holders = holders
	return nil
}

// A batch's events answer the speculative entries of its pod in one Drop
// (one round trip with the shared store, where it was two per event):
// every stored or removed hash, for the pod with and without its rank; a
// one-event batch passes its hashes without a copy.
func TestDropAnsweredOneDropPerBatch(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	rec := &dropRecorder{}
	ix.pick.spec, ix.pick.specMem = rec, nil
	b := &event.Batch{Pod: "p", DPRank: 1, Model: "m", Events: []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{1, 2}},
		{Kind: event.AllBlocksCleared},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{3}},
		{Kind: event.BlockStored, BlockHashes: []uint64{4, 5}},
	}}
	ix.dropAnswered(context.Background(), b)
	if rec.calls != 1 || !slices.Equal(rec.hashes, []uint64{1, 2, 3, 4, 5}) ||
		rec.holders != [2]uint64{holderID("p", 1), holderID("p", -1)} {
		t.Fatalf("%d Drop calls, last with %v for %v", rec.calls, rec.hashes, rec.holders)
	}
	one := &event.Batch{Pod: "p", Model: "m", Events: []event.Event{{Kind: event.BlockStored, BlockHashes: []uint64{6}}}}
	if n := testing.AllocsPerRun(100, func() { ix.dropAnswered(context.Background(), one) }); n != 0 {
		t.Errorf("a one-event batch allocates %v times", n)
	}
}
