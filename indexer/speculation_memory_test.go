package indexer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

func holdKeys(from, n int) []blockkeys.Key {
	k := make([]blockkeys.Key, n)
	for i := range k {
		k[i] = blockkeys.Key(from + i)
	}
	return k
}

func extendOne(h *holdMap, keys []blockkeys.Key, pod uint64, start int32, now int64) int32 {
	ext := []int32{0}
	h.extend(1, keys, []uint64{pod}, []int32{start}, ext, now)
	return ext[0]
}

// The map holds at most its capacity; the oldest entries go first and are
// counted.
func TestHoldMapCapacity(t *testing.T) {
	h := newHoldMap(100, 8)
	keys := holdKeys(0, 10)
	h.hold(1, keys, 7, 0)
	if h.len() != 8 || h.evictions.Load() != 2 || len(h.m) != 8 {
		t.Fatalf("len %d evictions %d map %d", h.len(), h.evictions.Load(), len(h.m))
	}
	// blocks 0 and 1 were evicted: the run from 0 is empty, from 2 it is 8
	if n := extendOne(h, keys, 7, 0, 1); n != 0 {
		t.Fatalf("run from 0 = %d", n)
	}
	if n := extendOne(h, keys, 7, 2, 1); n != 8 {
		t.Fatalf("run from 2 = %d", n)
	}
	// Refreshing an entry re-queues it; the stale record does not remove it.
	h.hold(1, keys[9:], 7, 50)
	h.hold(1, holdKeys(100, 7), 8, 50)
	if n := extendOne(h, keys, 7, 9, 60); n != 1 {
		t.Fatalf("refreshed entry gone: %d", n)
	}
}

func TestHoldMapTTLAndDrop(t *testing.T) {
	h := newHoldMap(10, 64)
	keys := holdKeys(0, 4)
	h.hold(1, keys, 7, 0)
	if n := extendOne(h, keys, 7, 0, 9); n != 4 {
		t.Fatalf("live run = %d", n)
	}
	if n := extendOne(h, keys, 7, 0, 10); n != 0 {
		t.Fatalf("expired run = %d", n)
	}
	// The next write reclaims the expired entries.
	h.hold(1, holdKeys(50, 1), 8, 10)
	if h.len() != 1 || len(h.m) != 1 {
		t.Fatalf("after reclaim: len %d map %d", h.len(), len(h.m))
	}
	h.drop(1, holdKeys(50, 1), 9) // another pod: nothing
	if h.len() != 1 {
		t.Fatal("dropped another pod's entry")
	}
	h.drop(1, holdKeys(50, 1), 8)
	if h.len() != 0 {
		t.Fatalf("len after drop = %d", h.len())
	}
	// Another model shares nothing.
	h.hold(2, keys, 7, 20)
	if n := extendOne(h, keys, 7, 0, 21); n != 0 {
		t.Fatalf("other model matched %d", n)
	}
}

// Five pods on one block: the earliest-expiring holder is displaced.
func TestHoldMapWays(t *testing.T) {
	h := newHoldMap(100, 64)
	k := holdKeys(0, 1)
	for p := uint64(1); p <= holdWays+1; p++ {
		h.hold(1, k, p, int64(p))
	}
	if extendOne(h, k, 1, 0, 10) != 0 || extendOne(h, k, holdWays+1, 0, 10) != 1 || h.evictions.Load() != 1 || h.len() != holdWays {
		t.Fatalf("ways: evictions %d len %d", h.evictions.Load(), h.len())
	}
	// walk: candidate slots by holder; the run stops where no one extends.
	var tab holderTable
	tab.reset(2)
	tab.put(2, 0)
	tab.put(3, 1)
	h.hold(1, holdKeys(1, 2), 2, 10)
	run := []int32{0, 0}
	h.walk(1, holdKeys(0, 5), &tab, run, 11)
	if run[0] != 3 || run[1] != 1 {
		t.Fatalf("walk runs %v", run)
	}
}

// Picks, events and metric scrapes at once (run with -race).
func TestPickConcurrent(t *testing.T) {
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{SpeculativeCapacity: 64, HistoryCapacity: 64})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			var r PickResult
			for i := 0; i < 200; i++ {
				prompt := seqTokens(i%7, 8*testBlock)
				q := hashQuery(prompt, Candidate{Pod: "a", Events: EventsOn}, Candidate{Pod: "b", Load: routing.Load{Running: g}},
					Candidate{Pod: "c", Events: EventsOff})
				if err := ix.Pick(context.Background(), q, &r); err != nil {
					t.Error(err)
					return
				}
				clk.Advance(time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		for i := 0; i < 200; i++ {
			apply(ix, fmt.Sprintf("%c", 'a'+i%2), 0, storeEvent(seqTokens(i%7, 8*testBlock), 4, event.TierGPU))
		}
	})
	wg.Go(func() {
		for i := 0; i < 20; i++ {
			metricValue(t, ix, "kvindexd_pick_assumed_entries", map[string]string{"store": "speculative"})
		}
	})
	wg.Wait()
	if ix.pick.specMem.len() > 64 || ix.pick.hist.len() > 64 {
		t.Fatalf("bounds exceeded: %d %d", ix.pick.specMem.len(), ix.pick.hist.len())
	}
}
