package kvindex

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Tests that pin edges a mutation run showed unchecked: each names the
// behaviour it holds in place.

// Interning new names from many goroutines at once must give every caller
// the same id and create each once: the write-locked re-check is what stops
// two goroutines that both missed under the read lock from each appending
// an id.
func TestInternerConcurrentFirstSight(t *testing.T) {
	const goroutines, names = 8, 2000
	for round := 0; round < 5; round++ {
		in := NewInterner()
		var ready atomic.Int32
		var done sync.WaitGroup
		ids := make([][]PodID, goroutines)
		models := make([][]ModelID, goroutines)
		for g := 0; g < goroutines; g++ {
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Add(1)
				for ready.Load() < goroutines { // start together
					runtime.Gosched()
				}
				for i := 0; i < names; i++ {
					ids[g] = append(ids[g], in.Pod(fmt.Sprint("pod-", i), 0))
					models[g] = append(models[g], in.Model(fmt.Sprint("model-", i)))
				}
			}()
		}
		done.Wait()
		if n := in.NumPods(); n != names {
			t.Fatalf("round %d: NumPods = %d after interning %d names", round, n, names)
		}
		if s := in.ModelName(names); s != "" {
			t.Fatalf("round %d: more than %d model ids", round, names)
		}
		for g := 1; g < goroutines; g++ {
			if !slices.Equal(ids[g], ids[0]) || !slices.Equal(models[g], models[0]) {
				t.Fatalf("round %d: goroutines got different ids for the same names", round)
			}
		}
		for i := 0; i < names; i++ {
			if got := in.PodsNamed(fmt.Sprint("pod-", i)); len(got) != 1 {
				t.Fatalf("round %d: PodsNamed(pod-%d) = %v", round, i, got)
			}
		}
	}
}

// The first unknown id is the one just past the last interned: it must
// answer "unknown", not index past the end.
func TestInternerNamesJustPastTheEnd(t *testing.T) {
	in := NewInterner()
	in.Pod("a", 0)
	in.Pod("b", 3)
	in.Model("m")
	if n, r := in.PodName(PodID(in.NumPods())); n != "" || r != 0 {
		t.Errorf("PodName(NumPods()) = %q %d, want \"\" 0", n, r)
	}
	if n, r := in.PodName(1); n != "b" || r != 3 {
		t.Errorf("PodName(1) = %q %d", n, r)
	}
	if s := in.ModelName(1); s != "" {
		t.Errorf("ModelName(1) = %q with one model", s)
	}
	if s := NewInterner().ModelName(0); s != "" {
		t.Errorf("ModelName(0) of an empty interner = %q", s)
	}
	if n, _ := NewInterner().PodName(0); n != "" {
		t.Errorf("PodName(0) of an empty interner = %q", n)
	}
}

// The capacity bound holds after every single Add, also when every stored
// key was referenced since the CLOCK hand last passed: the sweep must then
// clear the bits in one pass and evict in the next, not give up.
func TestMemoryIndexCapacityAfterEveryAdd(t *testing.T) {
	ctx := context.Background()
	for _, capacity := range []int64{1, 2, 7, 64, 100, 1000} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			idx := NewMemoryIndex(MemoryConfig{Capacity: capacity})
			check := func(what string) {
				t.Helper()
				if st := idx.Stats(); st.Entries > capacity {
					t.Fatalf("%s: Entries = %d > Capacity %d (%+v)", what, st.Entries, capacity, st)
				}
			}
			// fill exactly to the bound: nothing may be evicted yet
			for k := int64(0); k < capacity; k++ {
				if err := idx.Add(ctx, 0, 1, TierGPU, 0, []Key{Key(k)}); err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("fill key %d", k))
			}
			if st := idx.Stats(); st.Entries != capacity || st.Evictions != 0 {
				t.Fatalf("filled to the bound: %+v, want %d entries and no evictions", st, capacity)
			}
			// every key is referenced now; re-adding keeps it so
			for k := int64(0); k < capacity; k++ {
				_ = idx.Add(ctx, 0, 1, TierGPU, 0, []Key{Key(k)})
			}
			// one new key at a time, from another pod and tier too
			for k := int64(0); k < 3*capacity+5; k++ {
				pod, tier := PodID(k%3), Tier(k%2)
				if err := idx.Add(ctx, 0, pod, tier, 0, []Key{Key(1_000_000 + k)}); err != nil {
					t.Fatal(err)
				}
				check(fmt.Sprintf("new key %d", k))
				// the key just stored is never the one evicted for it
				if len(holdersOf(t, idx, 0, Key(1_000_000+k))) == 0 {
					t.Fatalf("key %d evicted by its own Add", k)
				}
			}
			st := idx.Stats()
			if st.Entries != capacity {
				t.Errorf("Entries = %d, want the index full at %d", st.Entries, capacity)
			}
			if st.Entries+st.Evictions != capacity+3*capacity+5 {
				t.Errorf("Entries %d + Evictions %d != %d stored", st.Entries, st.Evictions, 4*capacity+5)
			}
			checkInvariants(t, idx)
		})
	}
}

// An Add that a ClearPod overtakes must not commit its counters (the clear
// reset them and the holders written are invisible), and it stops writing
// once it sees the new epoch.
func TestMemoryIndexAddRacingClearPod(t *testing.T) {
	ctx := context.Background()
	const n = 200_000
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key(i + 1)
	}
	for attempt := 0; attempt < 50; attempt++ {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 4 * n})
		done := make(chan error, 1)
		go func() { done <- idx.Add(ctx, 0, 7, TierGPU, 0, keys) }()
		// clear once the Add is under way but (likely) not finished
		for idx.Stats().Keys < n/8 {
			runtime.Gosched()
		}
		if err := idx.ClearPod(ctx, 7); err != nil {
			t.Fatal(err)
		}
		atClear := idx.Stats().Keys
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if atClear > n-100 {
			continue // the Add (nearly) finished before the clear: try again
		}
		st := idx.Stats()
		// at most the key in flight when the epoch moved is written after it
		if st.Keys > atClear+1 {
			t.Fatalf("Add went on writing after the clear: %d keys stored at the clear, %d at the end", atClear, st.Keys)
		}
		if st.Entries != 0 || idx.PodEntries(7) != 0 || podBlocks(t, idx, 7) != 0 {
			t.Fatalf("after a clear that overtook Add: Entries %d, PodEntries %d, PodBlocks %d; want 0 (nothing is visible)",
				st.Entries, idx.PodEntries(7), podBlocks(t, idx, 7))
		}
		for _, k := range []Key{keys[0], keys[n/2], keys[n-1]} {
			if hs := holdersOf(t, idx, 0, k); len(hs) != 0 {
				t.Fatalf("key %d still visible after the clear: %v", k, hs)
			}
		}
		// the pod's next Add counts from zero
		if err := idx.Add(ctx, 0, 7, TierGPU, 0, keys[:10]); err != nil {
			t.Fatal(err)
		}
		if st := idx.Stats(); st.Entries != 10 || idx.PodEntries(7) != 10 {
			t.Fatalf("after re-adding 10 keys: %+v, PodEntries %d", st, idx.PodEntries(7))
		}
		checkInvariants(t, idx)
		return
	}
	t.Skip("the clear never landed during the Add in 50 attempts (machine too fast or too loaded)")
}

// scriptedIndex hands fixed holder lists to the generic scoring path, as a
// backend whose lists come in any order (or hold a tier this build does not
// know) would.
type scriptedIndex struct {
	Index
	blocks [][]Holder
}

func (s scriptedIndex) Lookup(_ context.Context, _ ModelID, keys []Key, v Visitor) error {
	for i := range keys {
		if i >= len(s.blocks) || !v.Visit(i, keys[i], s.blocks[i]) {
			return nil
		}
	}
	return nil
}

// With equal tier weights the generic path keeps crediting the tier it
// first saw for a block (as the fused path, whose holders are sorted by
// tier, does); a holder with an out-of-range tier is ignored, not scored.
func TestScorerGenericTiesAndBadTiers(t *testing.T) {
	ctx := context.Background()
	w := TierWeights{TierGPU: 1, TierCPU: 0.5, TierDisk: 0.5, TierExternal: 0.5}
	idx := scriptedIndex{blocks: [][]Holder{
		{{Pod: 1, Tier: TierCPU}, {Pod: 1, Tier: TierDisk}, {Pod: 2, Tier: 7}, {Pod: 3, Tier: NumTiers}},
		{{Pod: 1, Tier: TierCPU}, {Pod: 1, Tier: TierExternal}, {Pod: 2, Tier: TierGPU}},
		{{Pod: 1, Tier: TierDisk}, {Pod: 1, Tier: TierCPU}},
	}}
	s := NewScorer(idx, nil, w)
	var res ScoreResult
	if err := s.Score(ctx, 0, []Key{1, 2, 3}, nil, &res); err != nil {
		t.Fatal(err)
	}
	want := []PodScore{{Pod: 1, MatchedBlocks: 3, Score: 1.5, TierBlocks: [NumTiers]int32{TierCPU: 2, TierDisk: 1}}}
	if !samePodScores(res.Pods, want) {
		t.Fatalf("got %+v\nwant %+v", res.Pods, want)
	}
	// the same with pods 2 and 3 as candidates: their bad-tier holders at
	// block 0 do not start a run
	if err := s.Score(ctx, 0, []Key{1, 2, 3}, []PodID{2, 3}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 0 {
		t.Fatalf("bad-tier holders scored: %+v", res.Pods)
	}

	// Fused and generic agree under equal weights on a real index, tiers
	// included.
	mem := NewMemoryIndex(MemoryConfig{})
	for p := PodID(0); p < 4; p++ {
		for tier := Tier(0); tier < NumTiers; tier++ {
			if (int(p)+int(tier))%2 == 0 || tier == TierExternal {
				_ = mem.Add(ctx, 0, p, tier, 0, []Key{1, 2, 3, 4, 5}[:2+int(p)])
			}
		}
	}
	flat := TierWeights{1, 1, 1, 1}
	var fused, generic ScoreResult
	if err := NewScorer(mem, mem, flat).Score(ctx, 0, []Key{1, 2, 3, 4, 5}, nil, &fused); err != nil {
		t.Fatal(err)
	}
	if err := NewScorer(visitorOnly{mem}, nil, flat).Score(ctx, 0, []Key{1, 2, 3, 4, 5}, nil, &generic); err != nil {
		t.Fatal(err)
	}
	if !samePodScores(fused.Pods, generic.Pods) || len(fused.Pods) != 4 {
		t.Fatalf("equal weights:\n fused   %+v\n generic %+v", fused.Pods, generic.Pods)
	}
	for _, ps := range fused.Pods {
		for tier := Tier(0); tier < NumTiers; tier++ {
			if (int(ps.Pod)+int(tier))%2 == 0 || tier == TierExternal {
				// the lowest tier the pod holds gets every block
				if ps.TierBlocks[tier] != int32(ps.MatchedBlocks) {
					t.Errorf("pod %d: tiers %v, want all %d blocks on %s", ps.Pod, ps.TierBlocks, ps.MatchedBlocks, tier)
				}
				break
			}
		}
	}
}

// lora_id 0 is "no LoRA" (some engines send 0 rather than nil): the block
// is hashed without LoRA extras and verified.
func TestApplierLoraIDZeroIsNoLoRA(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(70, 8)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	ev := stored(eh, toks, 4, 0, 2)
	ev.LoraID, ev.HasLoraID = 0, true
	e.apply("p", 0, EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 2 || p.ParityUnverified != 0 {
		t.Fatalf("lora_id 0: %+v, want 2 matches", p)
	}
}

// An event without block_size (0: not sent) says nothing about the block
// size: it is verified, not flagged as a block-size mismatch.
func TestApplierMissingBlockSizeIsNotWrong(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(80, 8)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	ev := stored(eh, toks, 4, 0, 2)
	ev.BlockSize = 0
	e.apply("p", 0, EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 2 || p.ParityMismatches != 0 || p.ParityHint != "" {
		t.Fatalf("no block_size: %+v, want 2 matches and no hint", p)
	}
}

// Token ids that do not fill exactly n blocks cannot be split into the
// event's blocks with certainty: none is hashed, all are unverified and
// indexed under the engine's hashes.
func TestApplierTokenCountMustBeBlocksTimesSize(t *testing.T) {
	for _, extra := range []int{1, -1, 4} {
		t.Run(fmt.Sprint(extra), func(t *testing.T) {
			e := newApplierEnv(t, cborSeed0)
			toks := seq(90, 12)
			eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
			ev := Event{Kind: BlockStored, BlockHashes: eh[:2], TokenIDs: toks[:8+extra], BlockSize: 4}
			e.apply("p", 0, EngineVLLM, ev)
			p := e.pod("p", 0)
			if p.ParityMatches != 0 || p.ParityMismatches != 0 || p.ParityUnverified != 2 {
				t.Fatalf("%d tokens for 2 blocks of 4: %+v, want 2 unverified", 8+extra, p)
			}
			id := e.podID("p", 0)
			for _, k := range eh[:2] {
				if !e.idx.has(id, Key(k)) {
					t.Fatalf("engine hash %d not indexed", k)
				}
			}
		})
	}
}

// Within one event, a block that cannot be verified (here: an extra key we
// cannot serialise) does not end verification: the next block's parent is
// the engine hash of the unverifiable one, whose digest is known from an
// earlier event, so the chain resumes.
func TestApplierChainResumesAfterUnverifiableBlock(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(100, 16)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 4))
	if p := e.pod("p", 0); p.ParityMatches != 4 {
		t.Fatalf("first pass: %+v", p)
	}
	ev := stored(eh, toks, 4, 0, 4)
	ev.ExtraKeys = [][]any{nil, {1.5}, nil, nil}
	e.apply("p", 0, EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 4+3 || p.ParityUnverified != 1 {
		t.Fatalf("second pass: %+v, want 3 more matches and 1 unverified", p)
	}
}

// The algorithm/seed diagnosis rehashes a request's FIRST block with the
// other algorithms. A mismatch first seen on a later block of a
// parentless event (its block 0 unverifiable) must not conclude anything
// from it; the next request's first block then names the algorithm.
func TestApplierDiagnosisWaitsForAFirstBlock(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	engineCfg := KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 4}
	toks := seq(200, 8)
	eh := engineKeys(t, engineCfg, toks, RequestExtras{})
	// another pod stores block 0: the model's digest cache now knows it
	e.apply("a", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	// pod b: block 0 unverifiable, block 1 hashed from the cached digest and
	// mismatching
	ev := stored(eh, toks, 4, 0, 2)
	ev.ExtraKeys = [][]any{{1.5}, nil}
	e.apply("b", 0, EngineVLLM, ev)
	p := e.pod("b", 0)
	if p.ParityMismatches != 1 || p.ParityUnverified != 1 {
		t.Fatalf("pod b: %+v, want block 1 mismatching and block 0 unverified", p)
	}
	if !strings.Contains(p.ParityHint, "waiting for a request's first block") {
		t.Fatalf("hint from a non-first block: %q", p.ParityHint)
	}
	e.apply("b", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	if p := e.pod("b", 0); !strings.HasPrefix(p.ParityHint, "hash algorithm: the engine hashes with sha256 ") {
		t.Fatalf("hint after a first block: %q", p.ParityHint)
	}
}
