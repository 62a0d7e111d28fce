package indexer

import (
	"testing"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TestPickPDSources: the kv_source is the holder of the most leading
// blocks beyond the chosen pair, a candidate or not; speculative blocks and
// the routing history never make one; a holder of no more is never named.
func TestPickPDSources(t *testing.T) {
	params := routing.Defaults()
	params.PD = routing.PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: -1} // always disaggregate
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{Params: &params, DefaultPolicy: routing.NameLeastLoaded})
	prompt := seqTokens(3, 64*testBlock)
	apply(ix, "pf", 0, storeEvent(prompt, 10, event.TierGPU))
	apply(ix, "dc2", 0, storeEvent(prompt, 30, event.TierCPU))
	apply(ix, "dc", 0, storeEvent(seqTokens(4, testBlock), 1, event.TierGPU)) // has events, not this prompt
	cands := []Candidate{{Pod: "pf", Role: routing.RolePrefill}, {Pod: "dc", Role: routing.RoleDecode},
		{Pod: "dc2", Role: routing.RoleDecode, Load: routing.Load{Running: 5}}}
	var r PickResult
	mustPick(t, ix, hashQuery(prompt, cands...), &r)
	k := r.KVSource
	if !r.PD || r.Pod != "dc" || r.Prefill != 0 || r.PrefillPod != "pf" || r.Split != routing.SplitRemote ||
		!r.HasKVSource || k.Pod != "dc2" || k.Candidate != 2 || k.Blocks != 30 || k.ExtraBlocks != 20 || k.Tiers[event.TierCPU] != 30 {
		t.Fatalf("first pick: %+v", r)
	}
	// dc and pf now hold the prompt speculatively (64 blocks): dc2's 30
	// confirmed blocks are no more than that, so nothing is named, and
	// the speculative holders are never sources either.
	mustPick(t, ix, hashQuery(prompt, cands...), &r)
	if r.Candidates[1].SpeculativeBlocks != 64 || r.Candidates[0].SpeculativeBlocks != 54 || r.HasKVSource {
		t.Fatalf("second pick: %+v", r)
	}
	// A pod the router does not offer holds more than the pair (two pods
	// new to the index): the best such holder is named, with no candidate
	// index.
	apply(ix, "other", 0, storeEvent(prompt, 40, event.TierGPU))
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "pf2", Role: routing.RolePrefill},
		Candidate{Pod: "dc3", Role: routing.RoleDecode}), &r)
	if !r.HasKVSource || r.KVSource.Pod != "other" || r.KVSource.Candidate != -1 || r.KVSource.Blocks != 40 {
		t.Fatalf("non-candidate source: %+v", r)
	}
}
