package indexer

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// otherSeedHashes are the engine hashes of a pod whose PYTHONHASHSEED
// differs from the indexer's (a parity mismatch): the applier indexes that
// pod's blocks under the indexer's keys and aliases the engine's hashes.
func otherSeedHashes(t *testing.T, tokens []uint32) []uint64 {
	t.Helper()
	cfg := testKeys
	cfg.Seed = "engine-seed-differs"
	h, err := blockkeys.NewHasher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		out = append(out, uint64(k))
	}
	return out
}

// A pod whose engine hashes differ from the indexer's is indexed under the
// indexer's keys; Pick's speculative entries for it are too. Its engine's
// BlockStored and BlockRemoved name the engine's hashes: the entries they
// answer must still go (before, they were dropped by the engine's hashes,
// matched nothing and lived the full TTL, so after an eviction Pick said
// the pod held what Score and the engine said it did not).
func TestSpeculationDroppedForMismatchedPod(t *testing.T) {
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{})
	prompt := seqTokens(500, 10*testBlock)
	eh := otherSeedHashes(t, prompt)
	if eh[0] == blockHashes(prompt, blockkeys.RequestExtras{})[0] {
		t.Fatal("the engine's hashes equal the indexer's: no mismatch to test")
	}
	tokensQuery := func() *PickQuery {
		return &PickQuery{Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt},
			Candidates: []Candidate{{Pod: "odd", Events: EventsOn}}}
	}
	var r PickResult
	mustPick(t, ix, tokensQuery(), &r)
	if n := ix.pick.specMem.len(); n != 10 {
		t.Fatalf("speculative entries after the pick = %d, want 10", n)
	}
	// The engine stores 6 blocks under its own hashes: their entries are
	// answered by real ones.
	apply(ix, "odd", 0, event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: prompt[:6*testBlock],
		Medium: event.TierGPU, BlockHashes: eh[:6]})
	if st := ix.applier.PodStats(); len(st) != 1 || st[0].ParityHint == "" {
		t.Fatalf("no parity hint: the pod was not taken as mismatched: %+v", st)
	}
	if n := ix.pick.specMem.len(); n != 4 {
		t.Fatalf("speculative entries after 6 stored blocks = %d, want 4", n)
	}
	// The engine evicts everything it stored: Score says 0, and so must
	// Pick (only blocks 6..9 stay speculative, after a gap that ends the run).
	apply(ix, "odd", 0, event.Event{Kind: event.BlockRemoved, Medium: event.TierGPU, BlockHashes: eh[:6]})
	var sr Result
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &sr); got != "total=10" {
		t.Fatalf("score after the eviction: %s", got)
	}
	mustPick(t, ix, tokensQuery(), &r)
	if c := r.Candidates[0]; c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0 {
		t.Fatalf("pick after the eviction: %+v, want nothing matched", c)
	}
	// That pick re-speculated the whole prompt; one re-announcement of the
	// first block answers exactly its entry.
	clk.Advance(time.Millisecond)
	apply(ix, "odd", 0, event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: prompt[:testBlock],
		Medium: event.TierGPU, BlockHashes: eh[:1]})
	mustPick(t, ix, tokensQuery(), &r)
	if c := r.Candidates[0]; c.MatchedBlocks != 10 || c.SpeculativeBlocks != 9 {
		t.Fatalf("pick after one real block: %+v, want 10 matched, 9 speculative", c)
	}
}

// An SGLang or TensorRT-LLM pod is indexed under its engine's keys, not
// vLLM's (the model's primary keys): Pick must hold its speculative entries
// under those keys too, so that the pod's own BlockStored and BlockRemoved
// drop them. Before, they were held under vLLM's keys, which no event of
// the pod names, and lived the full TTL: after an eviction Pick said the
// pod held what Score said it did not.
func TestSpeculationFollowsEachEnginesEvents(t *testing.T) {
	// SGLang with EAGLE publishes as SGLang, each position a pair
	// [t_i, t_i+1]; its pages are the pair keys (floor((n-1)/P) of them).
	for _, e := range []blockkeys.Engine{blockkeys.EngineSGLang, blockkeys.EngineTRTLLM, blockkeys.EngineSGLangEAGLE} {
		t.Run(blockkeys.Engines[e].Name, func(t *testing.T) {
			clk := newFakeClock()
			ix := newPickIndexer(t, clk, PickConfig{})
			prompt := seqTokens(900, 10*testBlock)
			eh := engineHashes(e, prompt)
			if eh[0] == blockHashes(prompt, blockkeys.RequestExtras{})[0] {
				t.Fatal("the engine's hashes equal vLLM's: nothing to test")
			}
			total := len(eh) // 10, EAGLE 9
			pub, pairs := e, e == blockkeys.EngineSGLangEAGLE
			if pairs {
				pub = blockkeys.EngineSGLang
			}
			store := func(from, to int) {
				ev := event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: prompt[from*testBlock : to*testBlock],
					Medium: event.TierGPU, BlockHashes: eh[from:to], Bigram: pairs}
				if pairs {
					ev.TokenIDs = nil
					for i := from * testBlock; i < to*testBlock; i++ {
						ev.TokenIDs = append(ev.TokenIDs, prompt[i], prompt[i+1])
					}
				}
				if from > 0 {
					ev.ParentHash, ev.HasParent = eh[from-1], true
				}
				ix.Sink().Apply(context.Background(), &event.Batch{Pod: "p", Model: testModel, Engine: pub, Events: []event.Event{ev}})
			}
			// The pod has published (its engine is known) and holds 2 blocks.
			store(0, 2)
			q := func() *PickQuery {
				return &PickQuery{Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt},
					Candidates: []Candidate{{Pod: "p", Events: EventsOn}}}
			}
			var r PickResult
			mustPick(t, ix, q(), &r)
			if c := r.Candidates[0]; c.MatchedBlocks != 2 || c.SpeculativeBlocks != 0 {
				t.Fatalf("first pick: %+v, want 2 matched", c)
			}
			if n := ix.pick.specMem.len(); n != int64(total-2) {
				t.Fatalf("speculative entries after the pick = %d, want %d", n, total-2)
			}
			mustPick(t, ix, q(), &r)
			if c := r.Candidates[0]; c.MatchedBlocks != total || c.SpeculativeBlocks != total-2 {
				t.Fatalf("second pick: %+v, want %d matched, %d speculative", c, total, total-2)
			}
			// The engine stores blocks 2..7 under its hashes: their entries go.
			store(2, 8)
			if n := ix.pick.specMem.len(); n != int64(total-8) {
				t.Fatalf("speculative entries after 6 stored blocks = %d, want %d", n, total-8)
			}
			if got := gaugeValue(t, ix, "kvindexd_pick_assumed_entries", "speculative"); got != float64(total-8) {
				t.Fatalf("kvindexd_pick_assumed_entries{store=speculative} = %v, want %d", got, total-8)
			}
			// It evicts everything: Score says 0, and so must Pick (blocks
			// 8.. stay speculative after a gap that ends the run).
			ix.Sink().Apply(context.Background(), &event.Batch{Pod: "p", Model: testModel, Engine: pub,
				Events: []event.Event{{Kind: event.BlockRemoved, Medium: event.TierGPU, BlockHashes: eh[:8]}}})
			var sr Result
			if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &sr); got != "total=10" {
				t.Fatalf("score after the eviction: %s", got)
			}
			mustPick(t, ix, q(), &r)
			if c := r.Candidates[0]; c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0 {
				t.Fatalf("pick after the eviction: %+v, want nothing matched", c)
			}
		})
	}
}
