package kvindex

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
)

// collectVisitor records each key's holders.
type collectVisitor struct{ got [][]Holder }

func (c *collectVisitor) Visit(_ int, _ blockkeys.Key, hs []Holder) bool {
	c.got = append(c.got, slices.Clone(hs))
	return true
}

func snapHolders(t *testing.T, idx *MemoryIndex, m ModelID, k blockkeys.Key) []Holder {
	t.Helper()
	var c collectVisitor
	if err := idx.Lookup(context.Background(), m, []blockkeys.Key{k}, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.got) == 0 {
		return nil
	}
	slices.SortFunc(c.got[0], func(a, b Holder) int {
		return int(a.Pod)<<8 + int(a.Tier) - (int(b.Pod)<<8 + int(b.Tier))
	})
	return c.got[0]
}

// Ranging over an index and restoring every block into a fresh one gives
// the same holders for every (model, key), the same per-pod counts and no
// holder of a cleared pod.
func TestRangeBlocksRestoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	rng := rand.New(rand.NewPCG(1, 2))
	type mk struct {
		m ModelID
		k blockkeys.Key
	}
	var all []mk
	for m := ModelID(0); m < 3; m++ {
		for p := PodID(0); p < 12; p++ {
			keys := make([]blockkeys.Key, 0, 200)
			for range 200 {
				keys = append(keys, blockkeys.Key(rng.Uint64N(3000)))
			}
			tier := event.Tier(p) % event.NumStoredTiers
			if err := src.Add(ctx, m, p, tier, keys); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				all = append(all, mk{m, k})
			}
		}
	}
	// Pod 5 is cleared: its entries stay in the table as stale holders and
	// must not be carried over.
	if err := src.ClearPod(ctx, 5); err != nil {
		t.Fatal(err)
	}
	dst := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	var blocks, entries int
	err := src.RangeBlocks(func(k SlotKey, hs []Holder) error {
		blocks++
		entries += len(hs)
		for _, h := range hs {
			if h.Pod == 5 {
				return fmt.Errorf("holder of the cleared pod in block %x", k)
			}
		}
		return dst.RestoreBlock(k, hs)
	})
	if err != nil {
		t.Fatal(err)
	}
	if int64(entries) != src.Stats().Entries || dst.Stats().Entries != src.Stats().Entries || dst.Stats().Keys != int64(blocks) {
		t.Fatalf("entries: ranged %d, src %+v, dst %+v, blocks %d", entries, src.Stats(), dst.Stats(), blocks)
	}
	for _, x := range all {
		if a, b := snapHolders(t, src, x.m, x.k), snapHolders(t, dst, x.m, x.k); !slices.Equal(a, b) {
			t.Fatalf("model %d key %d: src %v, restored %v", x.m, x.k, a, b)
		}
	}
	for p := PodID(0); p < 12; p++ {
		a, _ := src.PodBlocks(ctx, p)
		b, _ := dst.PodBlocks(ctx, p)
		if a != b || src.PodEntries(p) != dst.PodEntries(p) {
			t.Errorf("pod %d: blocks %d/%d entries %d/%d", p, a, b, src.PodEntries(p), dst.PodEntries(p))
		}
	}
	if SlotKeyOf(1, 42) == SlotKeyOf(2, 42) {
		t.Error("slot keys of two models collide")
	}
	if err := dst.RestoreBlock(1, []Holder{{Pod: 1, Tier: event.NumTiers}}); err == nil {
		t.Error("bad tier restored")
	}
}

// The walk allocates per shard, not per block.
func TestRangeBlocksAllocations(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts differ under -race")
	}
	idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	keys := make([]blockkeys.Key, 50000)
	for i := range keys {
		keys[i] = blockkeys.Key(i * 7)
	}
	for p := PodID(0); p < 4; p++ {
		_ = idx.Add(context.Background(), 0, p, event.TierGPU, keys)
	}
	n := 0
	allocs := testing.AllocsPerRun(3, func() {
		_ = idx.RangeBlocks(func(SlotKey, []Holder) error { n++; return nil })
	})
	if allocs > 64 {
		t.Errorf("%v allocations for %d blocks", allocs, len(keys))
	}
}

// RangeBlocks runs while writers add, remove and clear: every block it
// reports has live holders of real pods (run under -race).
func TestRangeBlocksConcurrentWriters(t *testing.T) {
	idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 16})
	ctx := context.Background()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		rng := rand.New(rand.NewPCG(5, 6))
		keys := make([]blockkeys.Key, 64)
		for {
			select {
			case <-done:
				return
			default:
			}
			for i := range keys {
				keys[i] = blockkeys.Key(rng.Uint64N(4096))
			}
			p := PodID(rng.IntN(4))
			switch rng.IntN(10) {
			case 0:
				_ = idx.ClearPod(ctx, p)
			case 1, 2, 3:
				_ = idx.Remove(ctx, 0, p, event.TierGPU, keys)
			default:
				_ = idx.Add(ctx, 0, p, event.TierGPU, keys)
			}
		}
	}()
	for range 50 {
		err := idx.RangeBlocks(func(_ SlotKey, hs []Holder) error {
			if len(hs) == 0 {
				return fmt.Errorf("block without holders")
			}
			for _, h := range hs {
				if h.Pod >= 4 || h.Tier != event.TierGPU {
					return fmt.Errorf("holder %+v", h)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	<-finished
}
