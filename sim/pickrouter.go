package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

// pickRouter routes with the daemon's own Pick: an indexer.Indexer over
// the in-memory index, fed by the pods' KV events through its sink, asked
// with indexer.Pick under one of package routing's policies, with
// speculative entries on the simulator's clock. It is the code a router
// calling /v1/pick runs, so the policy table compares what ships.
//
// The fleet's view has only each pod's in-flight count; the candidates'
// load is derived from it as an engine would report it: Running =
// min(load, MaxBatch), Waiting = the rest, KVUsage = Running/MaxBatch (a
// full batch fills the cache). Requests are asked by their trace hash_ids
// (block_hashes); a request without any full block goes to the least
// loaded pod.
type pickRouter struct {
	policy    string
	idx       *indexer.Indexer
	now       float64 // the simulator's clock at the current call
	names     []string
	seq       []uint64
	query     indexer.PickQuery
	res       indexer.PickResult
	batch     event.Batch
	blockSize int
	batchN    int
	next      int
}

// newPickRouter builds the indexer for a fleet of pods; specTTL (seconds)
// <= 0 turns speculative entries off.
func newPickRouter(pods, blockSize, maxBatch int, policy string, specTTL float64) (*pickRouter, error) {
	if maxBatch < 1 {
		return nil, fmt.Errorf("pick:%s: max batch must be >= 1", policy)
	}
	r := &pickRouter{policy: policy, seq: make([]uint64, pods), blockSize: blockSize, batchN: maxBatch}
	ttl := time.Duration(specTTL * float64(time.Second))
	if ttl <= 0 {
		ttl = -1
	}
	var err error
	r.idx, err = indexer.New(context.Background(), indexer.Config{
		Keys: blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: blockSize},
		Pick: indexer.PickConfig{DefaultPolicy: policy, SpeculativeTTL: ttl, Now: r.clock},
	})
	if err != nil {
		return nil, fmt.Errorf("pick:%s: %w", policy, err)
	}
	r.query = indexer.PickQuery{Query: indexer.Query{Model: "sim", Kind: indexer.InputHashes}, Candidates: make([]indexer.Candidate, pods)}
	for p := 0; p < pods; p++ {
		r.names = append(r.names, fmt.Sprintf("pod-%d", p))
		r.query.Candidates[p] = indexer.Candidate{Pod: r.names[p], Events: indexer.EventsOn}
	}
	return r, nil
}

func (r *pickRouter) clock() time.Time {
	return time.Unix(0, 0).Add(time.Duration(r.now * float64(time.Second)))
}

func (r *pickRouter) name() string { return "pick:" + r.policy }

func (r *pickRouter) route(q *Request, v *view) int {
	r.now = v.Now
	if len(q.HashIDs) == 0 {
		return leastLoaded(v.Load, &r.next)
	}
	for p, l := range v.Load {
		c := &r.query.Candidates[p]
		c.Running = min(l, r.batchN)
		c.Waiting = l - c.Running
		c.KVUsage = float64(c.Running) / float64(r.batchN)
	}
	r.query.BlockHashes = q.HashIDs
	// Pick cannot fail here (valid query, in-memory index, no deadline);
	// were it to, the request goes least-loaded.
	if err := r.idx.Pick(context.Background(), &r.query, &r.res); err != nil {
		return leastLoaded(v.Load, &r.next)
	}
	return r.res.Chosen
}

// onKVEvents feeds one pod's events to the daemon's sink (applier, then
// the speculative entries they answer are dropped).
func (r *pickRouter) onKVEvents(pod int, ops []kvOp, now float64) {
	r.now = now
	r.seq[pod]++
	b := &r.batch
	*b = event.Batch{Pod: r.names[pod], Model: "sim", Engine: blockkeys.EngineVLLM, Seq: r.seq[pod], Timestamp: now, Events: b.Events[:0]}
	for _, op := range ops {
		kind := event.BlockStored
		if op.Removed {
			kind = event.BlockRemoved
		}
		b.Events = append(b.Events, event.Event{Kind: kind, BlockHashes: op.Blocks, BlockSize: r.blockSize})
	}
	r.idx.Sink().Apply(context.Background(), b)
}

func init() {
	for _, name := range routing.Names() {
		routerFactories["pick:"+name] = func(p RouterParams) (router, error) {
			if p.MaxBatch == 0 {
				p.MaxBatch = DefaultServiceModel().MaxBatch
			}
			return newPickRouter(p.Pods, p.BlockSize, p.MaxBatch, name, p.SpecTTL)
		}
		RouterOrder = append(RouterOrder, "pick:"+name)
	}
}
