package kvindex

import (
	"context"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

func TestMemoryIndexCapacity(t *testing.T) {
	ctx := context.Background()
	keys := func(base, n int) []blockkeys.Key {
		ks := make([]blockkeys.Key, n)
		for i := range ks {
			ks[i] = blockkeys.Key(base + i)
		}
		return ks
	}
	t.Run("evicts and counts", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		if err := idx.Add(ctx, 0, 1, event.TierGPU, keys(0, 150)); err != nil {
			t.Fatal(err)
		}
		st := idx.Stats()
		if st.Entries > 100 || st.Entries < 90 {
			t.Errorf("Entries = %d, want at most 100 (and not far below)", st.Entries)
		}
		if st.Entries+st.Evictions != 150 {
			t.Errorf("Entries %d + Evictions %d != 150 added", st.Entries, st.Evictions)
		}
		if n := podBlocks(t, idx, 1); n != st.Entries {
			t.Errorf("PodBlocks = %d, Entries = %d", n, st.Entries)
		}
		visible := 0
		for _, k := range keys(0, 150) {
			if len(holdersOf(t, idx, 0, k)) > 0 {
				visible++
			}
		}
		if int64(visible) != st.Entries {
			t.Errorf("%d keys visible, Entries = %d", visible, st.Entries)
		}
		checkInvariants(t, idx)
	})
	t.Run("recently stored survive", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, event.TierGPU, keys(0, 100))
		// a full sweep clears every reference bit and evicts the oldest
		_ = idx.Add(ctx, 0, 1, event.TierGPU, keys(1000, 10))
		_ = idx.Add(ctx, 0, 1, event.TierGPU, keys(2000, 10))
		for _, k := range keys(2000, 10) {
			if len(holdersOf(t, idx, 0, k)) == 0 {
				t.Errorf("key %d, just stored, was evicted", k)
			}
		}
		checkInvariants(t, idx)
	})
	t.Run("stale holders are reclaimed, not evicted", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, event.TierGPU, keys(0, 100))
		_ = idx.ClearPod(ctx, 1)
		_ = idx.Add(ctx, 0, 2, event.TierGPU, keys(500, 100))
		st := idx.Stats()
		if st.Evictions != 0 || st.Entries != 100 {
			t.Errorf("after clear: %+v, want 100 entries and no evictions", st)
		}
		if n := podBlocks(t, idx, 2); n != 100 {
			t.Errorf("PodBlocks(2) = %d", n)
		}
		checkInvariants(t, idx)
	})
	t.Run("re-adding cleared keys at the bound", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, event.TierGPU, keys(0, 60))
		_ = idx.Add(ctx, 0, 2, event.TierGPU, keys(0, 40))
		_ = idx.ClearPod(ctx, 1)
		_ = idx.ClearPod(ctx, 2)
		_ = idx.Add(ctx, 0, 3, event.TierGPU, keys(0, 100))
		for _, k := range keys(0, 100) {
			if got := holdersOf(t, idx, 0, k); !slices.Equal(got, []Holder{{Pod: 3}}) {
				t.Fatalf("key %d: holders %v", k, got)
			}
		}
		if st := idx.Stats(); st.Entries != 100 || st.Evictions != 0 {
			t.Errorf("stats %+v", st)
		}
		checkInvariants(t, idx)
	})
	t.Run("evicting shared keys", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 64})
		for p := PodID(0); p < 4; p++ {
			_ = idx.Add(ctx, 0, p, event.TierGPU, keys(0, 16))
			_ = idx.Add(ctx, 0, p, event.TierCPU, keys(0, 4))
		}
		_ = idx.Add(ctx, 0, 9, event.TierGPU, keys(100, 40))
		st := idx.Stats()
		if st.Entries > 64 || st.Entries+st.Evictions != 4*20+40 {
			t.Errorf("stats %+v", st)
		}
		checkInvariants(t, idx)
	})
	t.Run("default capacity", func(t *testing.T) {
		if c := NewMemoryIndex(MemoryConfig{}).Capacity(); c != DefaultMemoryCapacity {
			t.Errorf("Capacity() = %d", c)
		}
	})
}

// TestMemoryIndexLazyReclaim checks that a cleared pod's holders leave memory
// when their keys are written again, not only when evicted.
func TestMemoryIndexLazyReclaim(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	ks := []blockkeys.Key{1, 2, 3}
	_ = idx.Add(ctx, 0, 1, event.TierGPU, ks)
	_ = idx.Add(ctx, 0, 2, event.TierGPU, ks)
	_ = idx.ClearPod(ctx, 1)
	_ = idx.Add(ctx, 0, 3, event.TierGPU, ks)
	used := int64(0)
	for i := range idx.shards {
		used += idx.shards[i].used
	}
	if used != 6 {
		t.Errorf("%d holder words in use, want 6 (pod 1's reclaimed)", used)
	}
	_ = idx.ClearPod(ctx, 2)
	_ = idx.ClearPod(ctx, 3)
	_ = idx.Remove(ctx, 0, 3, event.TierGPU, ks) // a write: reclaims the stale words
	if st := idx.Stats(); st.Keys != 0 || st.Entries != 0 {
		t.Errorf("after clearing every holder and touching the keys: %+v", st)
	}
	checkInvariants(t, idx)
}
