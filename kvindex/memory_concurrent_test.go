package kvindex

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TestMemoryIndexConcurrent runs writers (each owning some pods, keeping its
// own reference) and readers (lookups and scores) at once, then checks the
// final state exactly and the index's internal invariants. Under -race it
// also checks that the lock-free read path is free of data races.
func TestMemoryIndexConcurrent(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	sc := NewScorer(idx, idx, DefaultTierWeights())
	const writers, podsPerWriter, nkeys = 4, 3, 64
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	refs := make([]*refIndex, writers)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	stop := make(chan struct{})
	for w := 0; w < writers; w++ {
		ref := &refIndex{holders: map[refKey]map[Holder]bool{}}
		refs[w] = ref
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for s := 0; s < steps; s++ {
				p := PodID(w*podsPerWriter + rng.IntN(podsPerWriter))
				tier := event.Tier(rng.IntN(2))
				start := rng.IntN(nkeys)
				ks := make([]blockkeys.Key, 1+rng.IntN(8))
				for i := range ks {
					ks[i] = blockkeys.Key((start + i) % nkeys)
				}
				var err error
				switch r := rng.IntN(20); {
				case r < 12:
					err = idx.Add(ctx, 0, p, tier, ks)
					ref.add(0, p, tier, ks)
				case r < 19:
					err = idx.Remove(ctx, 0, p, tier, ks)
					ref.remove(0, p, tier, ks)
				default:
					err = idx.ClearPod(ctx, p)
					ref.clear(p)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	var rwg sync.WaitGroup
	for r := 0; r < 2; r++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			keys := make([]blockkeys.Key, nkeys)
			for i := range keys {
				keys[i] = blockkeys.Key(i)
			}
			var res ScoreResult
			var c collect
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.got = c.got[:0]
				if err := idx.Lookup(ctx, 0, keys, &c); err != nil {
					errs <- err
					return
				}
				for _, hs := range c.got {
					seen := map[Holder]bool{}
					for _, h := range hs {
						if seen[h] || h.Tier >= 2 || h.Pod >= writers*podsPerWriter {
							errs <- fmt.Errorf("impossible holder set %v", hs)
							return
						}
						seen[h] = true
					}
				}
				if err := sc.Score(ctx, 0, keys, nil, &res); err != nil {
					errs <- err
					return
				}
				for _, ps := range res.Pods {
					if ps.MatchedBlocks > nkeys || ps.MatchedBlocks <= 0 {
						errs <- fmt.Errorf("impossible score %+v", ps)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int64
	for k := blockkeys.Key(0); k < nkeys; k++ {
		var want []Holder
		for _, ref := range refs {
			for h := range ref.holders[refKey{0, k}] {
				want = append(want, h)
			}
		}
		slices.SortFunc(want, cmpHolder)
		total += int64(len(want))
		if got := holdersOf(t, idx, 0, k); !slices.Equal(got, want) {
			t.Errorf("key %d: holders %v, want %v", k, got, want)
		}
	}
	for w, ref := range refs {
		for i := 0; i < podsPerWriter; i++ {
			p := PodID(w*podsPerWriter + i)
			if got, want := podBlocks(t, idx, p), ref.podBlocks(p); got != want {
				t.Errorf("PodBlocks(%d) = %d, want %d", p, got, want)
			}
		}
	}
	if got := idx.Stats().Entries; got != total {
		t.Errorf("Entries = %d, want %d", got, total)
	}
	checkInvariants(t, idx)
}

// TestMemoryIndexConcurrentEviction stresses the eviction sweep against
// concurrent writers, clears and readers; it checks invariants, not timing.
func TestMemoryIndexConcurrentEviction(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{Capacity: 200})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			ks := make([]blockkeys.Key, 16)
			var c collect
			for s := 0; s < 400; s++ {
				for i := range ks {
					ks[i] = blockkeys.Key(rng.IntN(500))
				}
				p := PodID(rng.IntN(6))
				switch rng.IntN(10) {
				case 0:
					_ = idx.ClearPod(ctx, p)
				case 1, 2:
					_ = idx.Remove(ctx, 0, p, event.TierGPU, ks)
				case 3:
					c.got = c.got[:0]
					_ = idx.Lookup(ctx, 0, ks, &c)
				default:
					if err := idx.Add(ctx, 0, p, event.Tier(rng.IntN(2)), ks); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	st := idx.Stats()
	if st.Entries > 200 || st.Evictions == 0 {
		t.Errorf("stats %+v: want at most 200 entries and some evictions", st)
	}
	checkInvariants(t, idx)
}

// A reader that finds a writer in the middle of a change (the shard's
// sequence odd) for readSpins tries waits for the writer's lock, and then
// reads the state the writer left, not a torn one. (It used to yield with
// runtime.Gosched, which queued it behind every runnable goroutine.)
func TestMemoryIndexReaderWaitsForAStalledWriter(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	const m ModelID = 0
	k := blockkeys.Key(42)
	if err := idx.Add(ctx, m, 1, event.TierGPU, []blockkeys.Key{k}); err != nil {
		t.Fatal(err)
	}
	salt := modelSalt(m)
	h := mix64(uint64(k) ^ salt)
	sh := idx.shardOf(h)
	// A writer descheduled mid-change: it holds the lock, the sequence odd.
	sh.mu.Lock()
	sh.seq.Add(1)
	done := make(chan []Holder)
	go func() {
		var c collect
		_ = idx.Lookup(ctx, m, []blockkeys.Key{k}, &c)
		var hs []Holder
		if len(c.got) > 0 {
			hs = c.got[0]
		}
		done <- hs
	}()
	select {
	case hs := <-done:
		t.Fatalf("the reader returned %v while the writer was mid-change", hs)
	case <-time.After(50 * time.Millisecond):
	}
	// The writer finishes its change: a second holder.
	idx.ensurePod(2)
	epoch := idx.epochOf(2)
	if _, _, err := sh.add(idx, h, uint64(k)^salt, packHolder(2, epoch, event.TierGPU)); err != nil {
		t.Fatal(err)
	}
	sh.seq.Add(1)
	sh.mu.Unlock()
	select {
	case hs := <-done:
		if len(hs) != 2 || hs[0].Pod != 1 || hs[1].Pod != 2 {
			t.Fatalf("the reader saw %v, want pods 1 and 2", hs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never returned after the writer unlocked")
	}
}

// A Remove that read the pod's epoch before a ClearPod reaches its shard
// after the pod's next Add put the key back under the new epoch: it must
// leave that holder alone. It used to match holders on pod and tier only,
// removed the new one, and (its own count skipped, the Add's kept) left the
// pod's entry counter one above its live holders
// (TestMemoryIndexConcurrentEviction caught it about once in 2,000 runs).
func TestMemoryIndexStaleRemoveKeepsTheNewEpochsHolder(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	const m ModelID = 0
	const p PodID = 3
	k := blockkeys.Key(77)
	if err := idx.Add(ctx, m, p, event.TierGPU, []blockkeys.Key{k}); err != nil {
		t.Fatal(err)
	}
	old := idx.epochOf(p)
	if err := idx.ClearPod(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, []blockkeys.Key{k}); err != nil {
		t.Fatal(err)
	}
	// The stale Remove's step under the shard lock, as Remove runs it.
	sk := uint64(k) ^ modelSalt(m)
	h := mix64(sk)
	sh := idx.shardOf(h)
	sh.mu.Lock()
	sh.seq.Add(1)
	removed, _, err := sh.remove(idx, h, sk, packHolder(p, old, event.TierGPU))
	sh.seq.Add(1)
	sh.mu.Unlock()
	if err != nil || removed {
		t.Fatalf("a remove of the old epoch's holder removed %v (err %v), want false", removed, err)
	}
	if n, _ := idx.PodBlocks(ctx, p); n != 1 {
		t.Fatalf("pod holds %d blocks after the stale remove, want 1", n)
	}
	checkInvariants(t, idx)
}
