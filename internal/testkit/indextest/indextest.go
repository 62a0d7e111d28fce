// Package indextest is the behaviour every kvindex.Index backend must show,
// as one table of subtests (Run) that each backend's tests call with a
// constructor, so the memory and Redis backends are held to the same
// semantics. It also has the small lookup helpers those tests share.
package indextest

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// NewIndex makes an empty index that interns names through in (Redis maps
// the names it stores through it). Stats must reflect every write made so
// far when called (wrap a backend that refreshes them in the background).
type NewIndex func(t *testing.T, in *kvindex.Interner) kvindex.Index

// Visit is one Visitor.Visit call, holders sorted for comparison.
type Visit struct {
	I       int
	Key     blockkeys.Key
	Holders []kvindex.Holder
}

type recorder struct {
	visits []Visit
	stopAt int // Visit returns false at this index (-1: never)
}

func (r *recorder) Visit(i int, key blockkeys.Key, holders []kvindex.Holder) bool {
	h := slices.Clone(holders)
	slices.SortFunc(h, func(a, b kvindex.Holder) int {
		if holderLess(a, b) {
			return -1
		}
		if holderLess(b, a) {
			return 1
		}
		return 0
	})
	r.visits = append(r.visits, Visit{i, key, h})
	return i != r.stopAt
}

// Lookup runs idx.Lookup and returns the visits, the visitor answering
// false at index stopAt (-1: never).
func Lookup(t *testing.T, idx kvindex.Index, m kvindex.ModelID, keys []blockkeys.Key, stopAt int) []Visit {
	t.Helper()
	r := &recorder{stopAt: stopAt}
	if err := idx.Lookup(context.Background(), m, keys, r); err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return r.visits
}

// Keys converts integers to keys.
func Keys(v ...uint64) []blockkeys.Key {
	out := make([]blockkeys.Key, len(v))
	for i, x := range v {
		out[i] = blockkeys.Key(x)
	}
	return out
}

// Run is the semantic table every Index backend must pass; each subtest
// gets a fresh interner and index from newIndex.
func Run(t *testing.T, newIndex NewIndex) {
	newIdx := func(t *testing.T) (kvindex.Index, *kvindex.Interner) {
		in := kvindex.NewInterner()
		return newIndex(t, in), in
	}
	ctx := context.Background()
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	podBlocks := func(t *testing.T, idx kvindex.Index, p kvindex.PodID) int64 {
		t.Helper()
		n, err := idx.PodBlocks(ctx, p)
		must(t, err)
		return n
	}
	expect := func(t *testing.T, got []Visit, want ...Visit) {
		t.Helper()
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("visits:\n got  %v\n want %v", got, want)
		}
	}
	H := func(p kvindex.PodID, tier event.Tier) kvindex.Holder {
		return kvindex.Holder{Pod: p, Tier: tier}
	}

	t.Run("empty", func(t *testing.T) {
		idx, in := newIdx(t)
		m := in.Model("m")
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3), -1))
		expect(t, Lookup(t, idx, m, nil, -1))
		if n := podBlocks(t, idx, in.Pod("a", 0)); n != 0 {
			t.Fatalf("PodBlocks = %d", n)
		}
	})

	t.Run("prefix stops at first miss", func(t *testing.T) {
		idx, in := newIdx(t)
		m, a := in.Model("m"), in.Pod("a", 0)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2, 3, 5)))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3, 4, 5), -1),
			Visit{0, 1, []kvindex.Holder{H(a, 0)}},
			Visit{1, 2, []kvindex.Holder{H(a, 0)}},
			Visit{2, 3, []kvindex.Holder{H(a, 0)}})
		expect(t, Lookup(t, idx, m, Keys(4, 1), -1))
		if n := podBlocks(t, idx, a); n != 4 {
			t.Fatalf("PodBlocks = %d, want 4", n)
		}
	})

	t.Run("visitor stops", func(t *testing.T) {
		idx, in := newIdx(t)
		m, a := in.Model("m"), in.Pod("a", 0)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2, 3)))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3), 1),
			Visit{0, 1, []kvindex.Holder{H(a, 0)}},
			Visit{1, 2, []kvindex.Holder{H(a, 0)}})
	})

	t.Run("several pods tiers ranks", func(t *testing.T) {
		idx, in := newIdx(t)
		m := in.Model("m")
		a, b, a1 := in.Pod("a", 0), in.Pod("10.0.0.2:8000", 0), in.Pod("a", 1)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2)))
		must(t, idx.Add(ctx, m, a, event.TierCPU, Keys(1, 2, 3)))
		must(t, idx.Add(ctx, m, b, event.TierDisk, Keys(1)))
		must(t, idx.Add(ctx, m, a1, event.TierExternal, Keys(2)))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3, 4), -1),
			Visit{0, 1, []kvindex.Holder{H(a, 0), H(a, 1), H(b, 2)}},
			Visit{1, 2, []kvindex.Holder{H(a, 0), H(a, 1), H(a1, 3)}},
			Visit{2, 3, []kvindex.Holder{H(a, 1)}})
		// PodBlocks counts distinct blocks: 1,2 on two tiers count once.
		for p, want := range map[kvindex.PodID]int64{a: 3, b: 1, a1: 1} {
			if n := podBlocks(t, idx, p); n != want {
				t.Fatalf("PodBlocks(%d) = %d, want %d", p, n, want)
			}
		}
		// Removing one tier keeps the other.
		must(t, idx.Remove(ctx, m, a, event.TierGPU, Keys(1, 2)))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3), -1),
			Visit{0, 1, []kvindex.Holder{H(a, 1), H(b, 2)}},
			Visit{1, 2, []kvindex.Holder{H(a, 1), H(a1, 3)}},
			Visit{2, 3, []kvindex.Holder{H(a, 1)}})
		if n := podBlocks(t, idx, a); n != 3 {
			t.Fatalf("PodBlocks(a) after tier remove = %d, want 3", n)
		}
		must(t, idx.Remove(ctx, m, a, event.TierCPU, Keys(3)))
		if n := podBlocks(t, idx, a); n != 2 {
			t.Fatalf("PodBlocks(a) = %d, want 2", n)
		}
	})

	t.Run("add idempotent, remove unknown ignored", func(t *testing.T) {
		idx, in := newIdx(t)
		m, a := in.Model("m"), in.Pod("a", 0)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2)))
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2)))
		must(t, idx.Remove(ctx, m, a, event.TierGPU, Keys(7, 8)))
		must(t, idx.Remove(ctx, m, in.Pod("nobody", 0), event.TierGPU, Keys(1)))
		if n := podBlocks(t, idx, a); n != 2 {
			t.Fatalf("PodBlocks = %d, want 2", n)
		}
		if s := idx.Stats(); s.Entries != 2 {
			t.Fatalf("Stats.Entries = %d, want 2", s.Entries)
		}
		must(t, idx.Remove(ctx, m, a, event.TierGPU, Keys(1)))
		expect(t, Lookup(t, idx, m, Keys(1, 2), -1))
		expect(t, Lookup(t, idx, m, Keys(2), -1), Visit{0, 2, []kvindex.Holder{H(a, 0)}})
	})

	t.Run("models are separate", func(t *testing.T) {
		idx, in := newIdx(t)
		m1, m2, a := in.Model("llama"), in.Model("org/{weird}%model"), in.Pod("a", 0)
		must(t, idx.Add(ctx, m1, a, event.TierGPU, Keys(1)))
		must(t, idx.Add(ctx, m2, a, event.TierGPU, Keys(2)))
		expect(t, Lookup(t, idx, m1, Keys(2), -1))
		expect(t, Lookup(t, idx, m2, Keys(1), -1))
		expect(t, Lookup(t, idx, m2, Keys(2), -1), Visit{0, 2, []kvindex.Holder{H(a, 0)}})
	})

	t.Run("clear pod", func(t *testing.T) {
		idx, in := newIdx(t)
		m, a, b := in.Model("m"), in.Pod("a", 0), in.Pod("b", 0)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2, 3)))
		must(t, idx.Add(ctx, m, b, event.TierGPU, Keys(1)))
		must(t, idx.ClearPod(ctx, a))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3), -1), Visit{0, 1, []kvindex.Holder{H(b, 0)}})
		if n := podBlocks(t, idx, a); n != 0 {
			t.Fatalf("PodBlocks after clear = %d", n)
		}
		if s := idx.Stats(); s.Entries != 1 {
			t.Fatalf("Stats.Entries after clear = %d, want 1", s.Entries)
		}
		// Re-adding after a clear works and counts from zero.
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(2)))
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1)))
		expect(t, Lookup(t, idx, m, Keys(1, 2, 3), -1),
			Visit{0, 1, []kvindex.Holder{H(a, 0), H(b, 0)}},
			Visit{1, 2, []kvindex.Holder{H(a, 0)}})
		if n := podBlocks(t, idx, a); n != 2 {
			t.Fatalf("PodBlocks after re-add = %d, want 2", n)
		}
		// Removing a stale (pre-clear) block is a no-op for the counters.
		must(t, idx.Remove(ctx, m, a, event.TierGPU, Keys(3)))
		if n := podBlocks(t, idx, a); n != 2 {
			t.Fatalf("PodBlocks after stale remove = %d, want 2", n)
		}
		must(t, idx.ClearPod(ctx, in.Pod("never-seen", 3)))
	})

	t.Run("zero ids and fields at their limits", func(t *testing.T) {
		// ModelID 0, PodID 0 and key 0 are ordinary values, and the
		// largest tier is a distinct holder, not a wrapped one.
		idx, in := newIdx(t)
		m, a, b := in.Model("m"), in.Pod("a", 0), in.Pod("b", 0)
		if m != 0 || a != 0 {
			t.Fatalf("first ids = %d, %d; want 0, 0", m, a)
		}
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(0, 1)))
		must(t, idx.Add(ctx, m, a, event.TierExternal, Keys(0)))
		must(t, idx.Add(ctx, m, b, event.TierGPU, Keys(0)))
		expect(t, Lookup(t, idx, m, Keys(0, 1), -1),
			Visit{0, 0, []kvindex.Holder{H(a, 0), H(a, 3), H(b, 0)}},
			Visit{1, 1, []kvindex.Holder{H(a, 0)}})
		must(t, idx.Remove(ctx, m, a, event.TierExternal, Keys(0)))
		must(t, idx.ClearPod(ctx, b))
		expect(t, Lookup(t, idx, m, Keys(0), -1), Visit{0, 0, []kvindex.Holder{H(a, 0)}})
		if n := podBlocks(t, idx, a); n != 2 {
			t.Fatalf("PodBlocks(0) = %d, want 2", n)
		}
	})

	t.Run("pod blocks batch", func(t *testing.T) {
		idx, in := newIdx(t)
		b, ok := idx.(kvindex.PodBlocksBatcher)
		if !ok {
			t.Skip("this backend answers pod listings with PodBlocks one pod at a time")
		}
		m, a, a1, c := in.Model("m"), in.Pod("a", 0), in.Pod("a", 1), in.Pod("c", 0)
		must(t, idx.Add(ctx, m, a, event.TierGPU, Keys(1, 2, 3)))
		must(t, idx.Add(ctx, m, a, event.TierCPU, Keys(3, 4)))
		must(t, idx.Add(ctx, m, a1, event.TierGPU, Keys(1)))
		must(t, idx.Add(ctx, m, c, event.TierGPU, Keys(9)))
		must(t, idx.ClearPod(ctx, c))
		pods := []kvindex.PodID{a1, in.Pod("never-seen", 0), a, c, a}
		got := make([]int64, len(pods))
		must(t, b.PodBlocksBatch(ctx, pods, got))
		if want := []int64{1, 0, 4, 0, 4}; !slices.Equal(got, want) {
			t.Fatalf("PodBlocksBatch = %v, want %v", got, want)
		}
		must(t, b.PodBlocksBatch(ctx, nil, nil))
	})

	t.Run("invalid tier is an error", func(t *testing.T) {
		idx, in := newIdx(t)
		if err := idx.Add(ctx, in.Model("m"), in.Pod("a", 0), event.NumTiers, Keys(1)); err == nil {
			t.Fatal("Add with tier NumTiers: no error")
		}
	})

	t.Run("randomized against a model", func(t *testing.T) {
		idx, in := newIdx(t)
		rng := rand.New(rand.NewSource(7))
		m := in.Model("m")
		pods := []kvindex.PodID{in.Pod("p0", 0), in.Pod("p1", 0), in.Pod("p1", 1), in.Pod("p2", 0)}
		type ent struct {
			k blockkeys.Key
			h kvindex.Holder
		}
		ref := map[ent]bool{}
		for step := 0; step < 300; step++ {
			p := pods[rng.Intn(len(pods))]
			tier := event.Tier(rng.Intn(2))
			var keys []blockkeys.Key
			for range 1 + rng.Intn(6) {
				keys = append(keys, blockkeys.Key(1+rng.Intn(12)))
			}
			switch r := rng.Intn(20); {
			case r < 12:
				must(t, idx.Add(ctx, m, p, tier, keys))
				for _, k := range keys {
					ref[ent{k, H(p, tier)}] = true
				}
			case r < 19:
				must(t, idx.Remove(ctx, m, p, tier, keys))
				for _, k := range keys {
					delete(ref, ent{k, H(p, tier)})
				}
			default:
				must(t, idx.ClearPod(ctx, p))
				for e := range ref {
					if e.h.Pod == p {
						delete(ref, e)
					}
				}
			}
			all := make([]blockkeys.Key, 12)
			for i := range all {
				all[i] = blockkeys.Key(i + 1)
			}
			var want []Visit
			for i, k := range all {
				var hs []kvindex.Holder
				for e := range ref {
					if e.k == k {
						hs = append(hs, e.h)
					}
				}
				if len(hs) == 0 {
					break
				}
				slices.SortFunc(hs, func(a, b kvindex.Holder) int {
					if holderLess(a, b) {
						return -1
					}
					return 1
				})
				want = append(want, Visit{i, k, hs})
			}
			expect(t, Lookup(t, idx, m, all, -1), want...)
			wantBlocks := make([]int64, len(pods))
			for i, p := range pods {
				blocks := map[blockkeys.Key]bool{}
				for e := range ref {
					if e.h.Pod == p {
						blocks[e.k] = true
					}
				}
				wantBlocks[i] = int64(len(blocks))
				if n := podBlocks(t, idx, p); n != wantBlocks[i] {
					t.Fatalf("step %d: PodBlocks(%d) = %d, want %d", step, p, n, wantBlocks[i])
				}
			}
			if b, ok := idx.(kvindex.PodBlocksBatcher); ok {
				got := make([]int64, len(pods))
				must(t, b.PodBlocksBatch(ctx, pods, got))
				if !slices.Equal(got, wantBlocks) {
					t.Fatalf("step %d: PodBlocksBatch = %v, want %v", step, got, wantBlocks)
				}
			}
		}
	})
}

// holderLess orders holders by (pod, tier).
func holderLess(a, b kvindex.Holder) bool {
	if a.Pod != b.Pod {
		return a.Pod < b.Pod
	}
	return a.Tier < b.Tier
}
