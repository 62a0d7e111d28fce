package sim

import (
	"context"
	"fmt"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
)

// preciseRouter routes on the product itself: the daemon's indexer.Indexer
// over its in-memory index, fed by the simulated pods' KV events through its
// sink (the daemon's apply path) and asked with the daemon's Score. Events
// carry the trace hash_ids as engine block hashes and no token ids, so the
// applier indexes them as our keys and reports parity "unverified", which is
// expected here; requests are scored by the same hash_ids (block_hashes).
//
// Choice: among pods passing the load guard (load <= minLoad + Guard.Abs),
// the one with the longest indexed prefix (ties: less loaded, then lower
// index); least-loaded when no eligible pod matches MinMatch of the prompt.
//
// With Speculative, the router also records, at routing time, that the chosen
// pod will hold the request's blocks, for TTL seconds. A speculative entry
// counts like an indexed block for the chosen pod until the pod's real events
// for that block arrive (which replace it) or the TTL passes. This covers the
// event lag: without it, a burst of requests sharing a new prefix scatters
// before the first one's BlockStored reaches the index.
type preciseRouter struct {
	Guard       loadGuard
	MinMatch    float64
	Speculative bool
	TTL         float64

	idx       *indexer.Indexer
	podIdx    map[string]int // pod name -> fleet index
	names     []string
	seq       []uint64
	query     indexer.Query
	res       indexer.Result
	matched   []int
	next      int
	batch     event.Batch
	blockSize int

	spec     map[specKey]float64 // (pod, block) -> expiry
	specFIFO []specEntry         // in expiry order (constant TTL)
}

type specKey struct {
	pod  int
	hash uint64
}

type specEntry struct {
	key specKey
	exp float64
}

// simModel names the one model every simulated pod serves.
const simModel = "sim"

// newPreciseRouter builds an in-memory indexer for a fleet of pods.
func newPreciseRouter(pods, blockSize int, guard loadGuard, minMatch float64, speculative bool, ttl float64) (*preciseRouter, error) {
	idx, err := indexer.New(context.Background(), indexer.Config{
		Keys: blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: blockSize}})
	if err != nil {
		return nil, fmt.Errorf("precise: %w", err)
	}
	r := &preciseRouter{Guard: guard, MinMatch: minMatch, Speculative: speculative, TTL: ttl, idx: idx,
		podIdx: make(map[string]int, pods), seq: make([]uint64, pods), matched: make([]int, pods), blockSize: blockSize,
		query: indexer.Query{Model: simModel, Kind: indexer.InputHashes}}
	for p := 0; p < pods; p++ {
		name := fmt.Sprintf("pod-%d", p)
		r.podIdx[name] = p
		r.names = append(r.names, name)
	}
	if speculative {
		r.spec = make(map[specKey]float64)
	}
	return r, nil
}

func (r *preciseRouter) name() string {
	if r.Speculative {
		return "precise+spec"
	}
	return "precise"
}

// indexer exposes the indexer (tests read its pod listing).
func (r *preciseRouter) indexer() *indexer.Indexer { return r.idx }

func (r *preciseRouter) route(q *Request, v *view) int {
	r.match(q.HashIDs, r.matched)
	if r.Speculative {
		r.expire(v.Now)
		for p := range r.matched {
			k := 0
			for k < len(q.HashIDs) && (k < r.matched[p] || r.specLive(p, q.HashIDs[k], v.Now)) {
				k++
			}
			r.matched[p] = k
		}
	}
	best := affinityChoice(r.matched, q, v, r.Guard, r.MinMatch, &r.next)
	if r.Speculative {
		exp := v.Now + r.TTL
		for _, h := range q.HashIDs {
			k := specKey{best, h}
			r.spec[k] = exp
			r.specFIFO = append(r.specFIFO, specEntry{k, exp})
		}
	}
	return best
}

// match writes into matched[p] how many leading blocks of hashes fleet pod p
// holds according to the indexer (speculative entries not included).
func (r *preciseRouter) match(hashes []uint64, matched []int) {
	clear(matched)
	if len(hashes) == 0 {
		return
	}
	r.query.BlockHashes = hashes
	// Score cannot fail here (in-memory index, no deadline, valid query);
	// were it to, no pod matches and the request goes least-loaded.
	if err := r.idx.Score(context.Background(), &r.query, &r.res); err != nil {
		return
	}
	for _, ps := range r.res.Pods {
		if p, ok := r.podIdx[ps.Pod]; ok && p < len(matched) {
			matched[p] = ps.MatchedBlocks
		}
	}
}

func (r *preciseRouter) specLive(p int, h uint64, now float64) bool {
	exp, ok := r.spec[specKey{p, h}]
	return ok && exp > now
}

// expire drops speculative entries whose TTL passed; the FIFO is in expiry
// order because the TTL is constant. An entry refreshed later has a later
// expiry in the map, so the stale FIFO record must not delete it.
func (r *preciseRouter) expire(now float64) {
	i := 0
	for ; i < len(r.specFIFO) && r.specFIFO[i].exp <= now; i++ {
		e := r.specFIFO[i]
		if exp, ok := r.spec[e.key]; ok && exp <= now {
			delete(r.spec, e.key)
		}
	}
	if i > 0 {
		r.specFIFO = append(r.specFIFO[:0], r.specFIFO[i:]...)
	}
}

// specEntries is the number of live speculative entries (tests).
func (r *preciseRouter) specEntries() int { return len(r.spec) }

// onKVEvents feeds one pod's events to the applier as an engine batch, and
// drops the speculative entries the real events now answer for.
func (r *preciseRouter) onKVEvents(pod int, ops []kvOp, now float64) {
	r.seq[pod]++
	b := &r.batch
	*b = event.Batch{Pod: r.names[pod], Model: simModel, Engine: blockkeys.EngineVLLM, Seq: r.seq[pod], Timestamp: now,
		Events: b.Events[:0]}
	for _, op := range ops {
		kind := event.BlockStored
		if op.Removed {
			kind = event.BlockRemoved
		}
		b.Events = append(b.Events, event.Event{Kind: kind, BlockHashes: op.Blocks, BlockSize: r.blockSize})
		if r.Speculative {
			for _, h := range op.Blocks {
				delete(r.spec, specKey{pod, h})
			}
		}
	}
	r.idx.Sink().Apply(context.Background(), b)
}

func init() {
	routerFactories["precise"] = func(p RouterParams) (router, error) {
		return newPreciseRouter(p.Pods, p.BlockSize, loadGuard{p.GuardAbs}, p.MinMatch, false, 0)
	}
	routerFactories["precise+spec"] = func(p RouterParams) (router, error) {
		return newPreciseRouter(p.Pods, p.BlockSize, loadGuard{p.GuardAbs}, p.MinMatch, true, p.SpecTTL)
	}
}
