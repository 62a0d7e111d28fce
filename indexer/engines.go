package indexer

import (
	"slices"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
)

// Every engine publishes its own block hashes, and the index keeps each
// pod's blocks under its engine's hashes (blockkeys.HasherSet.ForEngine). A
// request is therefore hashed once per engine: its primary keys (vLLM's,
// which everything keyed by request identity uses: speculation, routing
// history, prediction) and, for every other engine whose batches were
// applied, that engine's keys. Each key sequence is scored and the pods of
// all of them merged: a pod is of one engine, so it matches one sequence
// (the others' 64-bit hashes are unrelated to its keys).

// engineKeys holds a request's keys under the engines other than vLLM.
type engineKeys struct {
	keys [blockkeys.NumEngines][]blockkeys.Key // [EngineVLLM] unused: the primary keys
	// computed: bit e set when keys[e] was computed from the request's
	// tokens (empty may then mean "no full block", not "not computed").
	computed uint32
	res      kvindex.ScoreResult // scratch for one engine's scores
	st       storageScratch      // storage sources (storage.go)
}

func (ek *engineKeys) clear() {
	for i := range ek.keys {
		if cap(ek.keys[i]) > maxKeptKeys {
			ek.keys[i] = nil
		}
		ek.keys[i] = ek.keys[i][:0]
	}
	ek.computed = 0
}

// otherEngines is the set of engines other than vLLM whose batches were
// applied (bit e for Engine e).
func (ix *Indexer) otherEngines() uint32 {
	return ix.applier.Engines() &^ (1 << blockkeys.EngineVLLM)
}

// engineTokenKeys hashes tokens with every applied engine other than vLLM.
func (ix *Indexer) engineTokenKeys(ek *engineKeys, model string, tokens []uint32, q *Query) {
	if ek == nil {
		return
	}
	set := ix.otherEngines()
	for e := blockkeys.Engine(0); e < blockkeys.NumEngines; e++ {
		if set&(1<<e) == 0 {
			continue
		}
		h := ix.hashers.ForEngine(model, e)
		ek.keys[e] = ix.keys.keys(h, ek.keys[e][:0], tokens, blockkeys.RequestExtras{LoraName: q.LoraName, CacheSalt: q.CacheSalt})
		ek.computed |= 1 << e
	}
}

// scoreEngines adds the scores of the other engines' key sequences to res
// and restores its order. res holds the primary keys' scores.
func (ix *Indexer) scoreEngines(ek *engineKeys, lookup func(keys []blockkeys.Key, res *kvindex.ScoreResult) *Error,
	res *kvindex.ScoreResult) *Error {
	if ek == nil {
		return nil
	}
	merged := false
	for e := range ek.keys {
		if len(ek.keys[e]) == 0 {
			continue
		}
		if err := lookup(ek.keys[e], &ek.res); err != nil {
			return err
		}
		res.Pods = append(res.Pods, ek.res.Pods...)
		merged = merged || len(ek.res.Pods) > 0
	}
	if merged {
		slices.SortFunc(res.Pods, kvindex.ComparePodScores)
	}
	return nil
}
