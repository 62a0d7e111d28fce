package indexer

import (
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
