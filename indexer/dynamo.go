package indexer

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// NVIDIA Dynamo's view of the index, for its standalone indexer's API
// (api/dynamo.go). Dynamo keys its radix tree by LocalBlockHash, the
// XXH3-64 of each block's own tokens (not chained, not the engine's hash),
// and its clients send those hashes to /query_by_hash. kvindexd's index is
// keyed by the engines' chained hashes, so it keeps a translation table:
// (model, parent engine hash, local hash) -> the block's engine hash, filled
// from the token ids of the BlockStored events it applies. A Dynamo hash
// sequence is walked from the root through the table, as Dynamo walks its
// tree, and the engine hashes it reaches are looked up in the index.
//
// The table is translation, not truth: who holds a block is always read
// from the index, so an entry outliving its block only costs memory. It is
// capped (Config.DynamoHashCapacity, kvindexd_dynamo_hashes); when full, a
// sweep drops the entries whose block no pod holds any more, and a
// translation that still finds no room is refused and counted
// (kvindexd_dynamo_hashes_refused_total): that block then goes unmatched by
// Dynamo hashes and out of the dump, never mismatched. Token queries do not
// need the table (DynamoScore).

// DynamoSeed is XXH3_SEED of Dynamo's lib/kv-router protocols.rs.
const DynamoSeed uint64 = 1337

// DynamoLoraSeed is the XXH3 seed Dynamo hashes a request's blocks with:
// DynamoSeed, plus xxh3_64(lora_name) (wrapping) for a non-empty adapter.
func DynamoLoraSeed(lora string) uint64 {
	if lora == "" {
		return DynamoSeed
	}
	return DynamoSeed + xxh3.HashString(lora)
}

// AppendDynamoHashes appends Dynamo's LocalBlockHash of each full block of
// tokens (a partial last block has none): XXH3-64 under seed of the block's
// token ids laid out as little-endian u32s. buf is scratch space, grown as
// needed and returned for reuse, so a caller holding one allocates nothing.
func AppendDynamoHashes(dst []uint64, buf []byte, tokens []uint32, blockSize int, seed uint64) ([]uint64, []byte) {
	if blockSize <= 0 {
		return dst, buf
	}
	if cap(buf) < 4*blockSize {
		buf = make([]byte, 4*blockSize)
	}
	b := buf[:4*blockSize]
	for start := 0; start+blockSize <= len(tokens); start += blockSize {
		for i, t := range tokens[start : start+blockSize] {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
		dst = append(dst, xxh3.HashSeed(b, seed))
	}
	return dst, buf
}

// dynEdge is one edge of Dynamo's tree: the block with local hash local
// whose parent is the block with engine hash parent (root: the first block
// of a sequence).
type dynEdge struct {
	parent uint64
	local  uint64
	model  kvindex.ModelID
	root   bool
}

type dynTable struct {
	// active is set by the first Dynamo registration (EnableDynamoHashes):
	// until then the apply path pays one atomic load per batch, and a
	// daemon no Dynamo client uses keeps no table.
	active  atomic.Bool
	mu      sync.RWMutex
	edges   map[dynEdge]blockkeys.Key
	cap     int
	refused int // translations refused since the last sweep

	entries  prometheus.GaugeFunc
	refusedC prometheus.Counter
	sweptC   prometheus.Counter
	held     holderProbe
}

// holderProbe reports whether any pod holds key for model (the sweep's
// question); the indexer's reads the index.
type holderProbe func(model kvindex.ModelID, key blockkeys.Key) bool

func newDynTable(capacity int, reg *prometheus.Registry, held holderProbe) (*dynTable, error) {
	if capacity <= 0 {
		capacity = int(Options.DynamoHashCapacity.Default)
	}
	t := &dynTable{edges: make(map[dynEdge]blockkeys.Key), cap: capacity, held: held}
	t.entries = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindexd_dynamo_hashes",
		Help: "Entries of the Dynamo LocalBlockHash translation table (what /query_by_hash's Dynamo hashes are walked through); at most the capacity.",
	}, func() float64 { t.mu.RLock(); defer t.mu.RUnlock(); return float64(len(t.edges)) })
	t.refusedC = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_dynamo_hashes_refused_total",
		Help: "Blocks whose Dynamo LocalBlockHash translation found no room in the full table (those blocks go unmatched by Dynamo hashes).",
	})
	t.sweptC = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_dynamo_hashes_swept_total",
		Help: "Dynamo translation entries dropped because no pod held their block any more when the table was full.",
	})
	for _, c := range []prometheus.Collector{t.entries, t.refusedC, t.sweptC} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// observe records the Dynamo edges of b's stored blocks. It runs on the
// apply path: no allocation per block once the map and buffers have grown.
// Blocks Dynamo would not index are skipped as Dynamo skips them: an event
// whose block_size is not the model's, token ids short of a block, or token
// pairs (EAGLE bigrams, which Dynamo's listener at the pinned version does
// not decode).
func (t *dynTable) observe(model kvindex.ModelID, blockSize int, evs []event.Event) {
	sc := dynScratchPool.Get().(*dynScratch)
	defer dynScratchPool.Put(sc)
	for i := range evs {
		ev := &evs[i]
		if ev.Kind != event.BlockStored || ev.Bigram || ev.BlockSize != blockSize || len(ev.BlockHashes) == 0 {
			continue
		}
		// Hash outside the lock (the apply workers of other pods share
		// the table); only the inserts hold it.
		n := min(len(ev.BlockHashes), len(ev.TokenIDs)/blockSize)
		sc.hashes, sc.buf = AppendDynamoHashes(sc.hashes[:0], sc.buf, ev.TokenIDs[:n*blockSize], blockSize, DynamoLoraSeed(ev.LoraName))
		if len(sc.hashes) == 0 {
			continue
		}
		parent, root := ev.ParentHash, !ev.HasParent
		t.mu.Lock()
		for j, local := range sc.hashes {
			t.insertLocked(dynEdge{parent: parent, local: local, model: model, root: root}, blockkeys.Key(ev.BlockHashes[j]))
			parent, root = ev.BlockHashes[j], false
		}
		t.mu.Unlock()
	}
}

// dynScratch is observe's per-call scratch space, pooled so concurrent
// apply workers neither share nor allocate it.
type dynScratch struct {
	buf    []byte
	hashes []uint64
}

var dynScratchPool = sync.Pool{New: func() any { return new(dynScratch) }}

func (t *dynTable) insertLocked(e dynEdge, k blockkeys.Key) {
	if old, ok := t.edges[e]; ok {
		if old != k {
			t.edges[e] = k // the same tokens under another engine hash (salt, adapter): the latest wins
		}
		return
	}
	if len(t.edges) >= t.cap {
		// Sweep at most once per cap/4 refusals: a sweep reads the index
		// for every entry, so it is amortized over that many inserts.
		if t.refused == 0 || t.refused >= t.cap/4 {
			t.sweepLocked()
		}
		if len(t.edges) >= t.cap {
			t.refused++
			t.refusedC.Inc()
			return
		}
	}
	t.edges[e] = k
}

// sweepLocked drops the entries whose block no pod holds.
func (t *dynTable) sweepLocked() {
	t.refused = 0
	n := 0
	for e, k := range t.edges {
		if !t.held(e.model, k) {
			delete(t.edges, e)
			n++
		}
	}
	t.sweptC.Add(float64(n))
}

// walk appends to keys the engine hashes the Dynamo hash sequence reaches
// from the root, stopping at the first it does not know, as Dynamo's tree
// walk stops at the first missing child.
func (t *dynTable) walk(model kvindex.ModelID, locals []uint64, keys []blockkeys.Key) []blockkeys.Key {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e := dynEdge{model: model, root: true}
	for _, l := range locals {
		e.local = l
		k, ok := t.edges[e]
		if !ok {
			break
		}
		keys = append(keys, k)
		e.parent, e.root = uint64(k), false
	}
	return keys
}

// DynamoEdge is one block of the Dynamo view: its engine hash, its parent's
// (Root: none) and the Dynamo LocalBlockHash of its tokens.
type DynamoEdge struct {
	Model     string
	Parent    uint64
	Root      bool
	Local     uint64
	BlockHash uint64
}

// DynamoRank is one (pod, DP rank) of a Dynamo-form answer: Blocks is how
// many nodes of the walked path it holds on the device tier, as Dynamo's
// find_matches adds one for every worker on each node it walks.
type DynamoRank struct {
	Pod    string
	DPRank int
	Blocks int
}

// DynamoResult is Dynamo's OverlapScores over kvindexd's index: Ranks (in
// the order first met) and Frequencies[d], how many ranks hold node d on the
// device tier.
type DynamoResult struct {
	Ranks       []DynamoRank
	Frequencies []int
}

// dynVisitor counts, per depth, the trusted pods holding the block on the
// GPU tier, and stops at the first depth none does: Dynamo's scores read
// its device tree only (lower tiers are kept apart from it), so a block
// held only on CPU, disk or shared storage ends the walk there.
type dynVisitor struct {
	ix    *Indexer
	res   *DynamoResult
	ids   []kvindex.PodID
	depth []kvindex.PodID // this depth's pods, deduplicated
}

func (v *dynVisitor) Visit(_ int, _ blockkeys.Key, holders []kvindex.Holder) bool {
	v.depth = v.depth[:0]
	for _, h := range holders {
		if h.Tier != event.TierGPU || !v.ix.trusted(h.Pod) {
			continue
		}
		dup := false
		for _, p := range v.depth {
			dup = dup || p == h.Pod
		}
		if !dup {
			v.depth = append(v.depth, h.Pod)
		}
	}
	if len(v.depth) == 0 {
		return false
	}
	v.res.Frequencies = append(v.res.Frequencies, len(v.depth))
	for _, p := range v.depth {
		i := 0
		for i < len(v.ids) && v.ids[i] != p {
			i++
		}
		if i == len(v.ids) {
			name, rank := v.ix.in.PodName(p)
			v.ids = append(v.ids, p)
			v.res.Ranks = append(v.res.Ranks, DynamoRank{Pod: name, DPRank: rank})
		}
		v.res.Ranks[i].Blocks++
	}
	return true
}

// DynamoScore answers Dynamo's /query_by_hash (locals: Dynamo
// LocalBlockHashes, walked through the translation table) and /query
// (tokens, when locals is nil) for model (an internal name, tenant.Model) as
// Dynamo's standalone indexer answers them on the same events. Tokens are
// turned into the engine's keys directly (with lora as the engine's
// adapter), not through the table: the same blocks Dynamo's hashes of them
// reach, and blocks the table never saw (restored from a snapshot or a
// peer, or written to a shared Redis index by another daemon) still count.
func (ix *Indexer) DynamoScore(ctx context.Context, model string, locals []uint64, tokens []uint32, lora string, out *DynamoResult) error {
	out.Ranks, out.Frequencies = out.Ranks[:0], out.Frequencies[:0]
	id, ok := ix.in.LookupModel(model)
	if !ok {
		return nil
	}
	var keys []blockkeys.Key
	if locals == nil {
		keys = ix.hashers.For(model).Keys(nil, tokens, blockkeys.RequestExtras{LoraName: lora})
	} else {
		keys = ix.dyn.walk(id, locals, nil)
	}
	if len(keys) == 0 {
		return nil
	}
	v := dynVisitor{ix: ix, res: out}
	if err := ix.idx.Lookup(ctx, id, keys, &v); err != nil {
		if ctx.Err() != nil {
			return ctxError(ctx.Err())
		}
		return errorf(Unavailable, "index lookup failed: %v", err)
	}
	return nil
}

// observeDynamo feeds b's stored blocks to the Dynamo translation table.
func (ix *Indexer) observeDynamo(b *event.Batch) {
	if ix.dyn == nil || len(b.Events) == 0 || !ix.dyn.active.Load() {
		return
	}
	ix.dyn.observe(ix.in.Model(b.Model), ix.hashers.For(b.Model).Config().BlockSize, b.Events)
}

// EnableDynamoHashes starts filling the Dynamo translation table
// (/query_by_hash's Dynamo hashes, /dump) from the next applied batch on.
// The Dynamo API's POST /register calls it: Dynamo's workers are known by
// registration, so their events come after it.
func (ix *Indexer) EnableDynamoHashes() {
	if ix.dyn != nil && !ix.dyn.active.Swap(true) {
		ix.log.Info("Dynamo LocalBlockHash translation on (first POST /register)", "capacity", ix.dyn.cap)
	}
}

// heldAnywhere is the sweep's probe: does any pod hold key for model?
func (ix *Indexer) heldAnywhere(model kvindex.ModelID, key blockkeys.Key) bool {
	var v anyHolder
	err := ix.idx.Lookup(context.Background(), model, []blockkeys.Key{key}, &v)
	return err != nil || v.found // an index that cannot answer keeps the entry
}

type anyHolder struct{ found bool }

func (a *anyHolder) Visit(int, blockkeys.Key, []kvindex.Holder) bool { a.found = true; return false }

// DynamoDumpEvent is one block of one (pod, rank) of Dynamo's /dump: a
// store of that block under its parent.
type DynamoDumpEvent struct {
	Pod       string
	DPRank    int
	Parent    uint64
	Root      bool
	BlockHash uint64
	Local     uint64
}

// DynamoDump calls fn for every model with its block size and, in an order
// where every parent comes before its children (breadth first, as Dynamo's
// dump_tree_as_events), one event per block per trusted (pod, rank) holding
// it on the GPU tier. It reads the index once per block; the table is read
// locked meanwhile, so event application waits for its translations.
func (ix *Indexer) DynamoDump(ctx context.Context, fn func(model string, blockSize int, evs []DynamoDumpEvent) error) error {
	if ix.dyn == nil {
		return nil
	}
	ix.dyn.mu.RLock()
	type child struct {
		e dynEdge
		k blockkeys.Key
	}
	byParent := map[[2]uint64]([]child){} // (model, parent) -> children
	roots := map[kvindex.ModelID][]child{}
	for e, k := range ix.dyn.edges {
		if e.root {
			roots[e.model] = append(roots[e.model], child{e, k})
		} else {
			key := [2]uint64{uint64(e.model), e.parent}
			byParent[key] = append(byParent[key], child{e, k})
		}
	}
	ix.dyn.mu.RUnlock()
	var v dynHolders
	for model, queue := range roots {
		var evs []DynamoDumpEvent
		for len(queue) > 0 {
			c := queue[0]
			queue = queue[1:]
			v.pods = v.pods[:0]
			if err := ix.idx.Lookup(ctx, model, []blockkeys.Key{c.k}, &v); err != nil {
				return errorf(Unavailable, "index lookup failed: %v", err)
			}
			held := false
			for _, p := range v.pods {
				if !ix.trusted(p) {
					continue
				}
				held = true
				name, rank := ix.in.PodName(p)
				evs = append(evs, DynamoDumpEvent{Pod: name, DPRank: rank, Parent: c.e.parent, Root: c.e.root, BlockHash: uint64(c.k), Local: c.e.local})
			}
			if held {
				queue = append(queue, byParent[[2]uint64{uint64(model), uint64(c.k)}]...)
			}
		}
		name := ix.in.ModelName(model)
		if err := fn(name, ix.hashers.For(name).Config().BlockSize, evs); err != nil {
			return err
		}
	}
	return nil
}

// dynHolders collects the pods holding one block on the GPU tier.
type dynHolders struct{ pods []kvindex.PodID }

func (d *dynHolders) Visit(_ int, _ blockkeys.Key, holders []kvindex.Holder) bool {
	for _, h := range holders {
		if h.Tier == event.TierGPU && !containsPod(d.pods, h.Pod) {
			d.pods = append(d.pods, h.Pod)
		}
	}
	return false
}

func containsPod(ids []kvindex.PodID, p kvindex.PodID) bool {
	for _, q := range ids {
		if q == p {
			return true
		}
	}
	return false
}
