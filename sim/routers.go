package sim

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/kvindex/kvindex/sim/cache"
	"github.com/zeebo/xxh3"
)

// noEvents is embedded by routers that never look at engine events.
type noEvents struct{}

func (noEvents) onKVEvents(int, []kvOp, float64) {}

// leastLoaded returns the pod with the fewest in-flight requests; ties go to
// the first such pod at or after *next, which then advances, so an idle fleet
// is filled round-robin rather than always from pod 0.
func leastLoaded(load []int, next *int) int {
	n := len(load)
	best, bestLoad := -1, math.MaxInt
	for k := 0; k < n; k++ {
		p := (*next + k) % n
		if load[p] < bestLoad {
			best, bestLoad = p, load[p]
		}
	}
	*next = (best + 1) % n
	return best
}

func minMax(load []int) (lo, hi int) {
	lo, hi = math.MaxInt, math.MinInt
	for _, l := range load {
		lo, hi = min(lo, l), max(hi, l)
	}
	return lo, hi
}

// randomRouter picks a pod uniformly at random (seeded: deterministic).
type randomRouter struct {
	noEvents
	rng *rand.Rand
}

func newRandomRouter(seed uint64) *randomRouter {
	return &randomRouter{rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
}
func (*randomRouter) name() string                    { return "random" }
func (r *randomRouter) route(_ *Request, v *view) int { return r.rng.IntN(len(v.Load)) }

// roundRobinRouter cycles through the pods.
type roundRobinRouter struct {
	noEvents
	next int
}

func (*roundRobinRouter) name() string { return "round-robin" }
func (r *roundRobinRouter) route(_ *Request, v *view) int {
	p := r.next % len(v.Load)
	r.next = p + 1
	return p
}

// leastLoadedRouter picks the pod with the fewest in-flight requests.
type leastLoadedRouter struct {
	noEvents
	next int
}

func (*leastLoadedRouter) name() string                    { return "least-loaded" }
func (r *leastLoadedRouter) route(_ *Request, v *view) int { return leastLoaded(v.Load, &r.next) }

// chwblRouter is KubeAI's PrefixHash strategy: consistent hashing with bounded
// loads on the prompt head. Each pod has Replication points on a ring
// (xxhash of name+replica); the request key (the first HeadBlocks hash_ids,
// standing in for KubeAI's first prefixCharLength=100 characters, which is
// well inside one 512-token block) hashes to a ring position, and the walk
// clockwise takes the first pod whose load passes KubeAI's chwblLoadOK:
// load+1 <= (totalLoad+1)/n * LoadFactor (always OK when the fleet is idle).
// If none passes, the first pod on the walk is used (KubeAI's default endpoint).
// Defaults from KubeAI's CRD: meanLoadPercentage 125, replication 256.
type chwblRouter struct {
	noEvents
	HeadBlocks int
	LoadFactor float64
	ring       []ringPoint
	buf        []byte
}

type ringPoint struct {
	h   uint64
	pod int
}

func newCHWBLRouter(pods, replication, headBlocks int, loadFactor float64) *chwblRouter {
	r := &chwblRouter{HeadBlocks: headBlocks, LoadFactor: loadFactor}
	for p := 0; p < pods; p++ {
		for i := 0; i < replication; i++ {
			r.ring = append(r.ring, ringPoint{xxh3.HashString(fmt.Sprintf("pod-%d%d", p, i)), p})
		}
	}
	sort.Slice(r.ring, func(i, j int) bool { return r.ring[i].h < r.ring[j].h })
	return r
}

func (*chwblRouter) name() string { return "chwbl" }

func (r *chwblRouter) route(q *Request, v *view) int {
	r.buf = r.buf[:0]
	for i := 0; i < r.HeadBlocks && i < len(q.HashIDs); i++ {
		r.buf = binary.LittleEndian.AppendUint64(r.buf, q.HashIDs[i])
	}
	h := xxh3.Hash(r.buf)
	i0 := sort.Search(len(r.ring), func(i int) bool { return r.ring[i].h >= h })
	total := 0
	for _, l := range v.Load {
		total += l
	}
	n := len(v.Load)
	for k := 0; k < len(r.ring); k++ {
		pt := r.ring[(i0+k)%len(r.ring)]
		if total == 0 || float64(v.Load[pt.pod])+1 <= float64(total+1)/float64(n)*r.LoadFactor {
			return pt.pod
		}
	}
	return r.ring[i0%len(r.ring)].pod
}

// podLRUs is a router-side model of what each pod caches, built only from the
// router's own routing history: routing r to p touches r's blocks in p's LRU.
type podLRUs []*cache.LRU

func newPodLRUs(pods, capacity int) podLRUs {
	l := make(podLRUs, pods)
	for i := range l {
		l[i] = cache.NewLRU(capacity)
	}
	return l
}

func (l podLRUs) prefix(p int, hs []uint64) int {
	k := 0
	for k < len(hs) && l[p].Contains(hs[k]) {
		k++
	}
	return k
}

func (l podLRUs) record(p int, hs []uint64, scratch []uint64) []uint64 {
	for _, h := range hs {
		scratch = l[p].Access(h, scratch[:0])
	}
	return scratch
}

// loadGuard keeps cache affinity from creating hot spots: a pod is eligible
// for a cache-affine choice only while load <= minLoad + Abs. Abs < 0 disables.
type loadGuard struct{ Abs int }

func (g loadGuard) ok(load []int, p, lo int) bool { return g.Abs < 0 || load[p] <= lo+g.Abs }

// affinityChoice is the decision approx-prefix and precise share, given each
// pod's matched leading blocks: among pods passing the load guard, the
// longest match (ties: less loaded, then lower index); least loaded when no
// eligible pod matches or the match covers less than minMatch of the prompt.
func affinityChoice(matched []int, q *Request, v *view, g loadGuard, minMatch float64, next *int) int {
	lo, _ := minMax(v.Load)
	best, bestK := -1, 0
	for p, k := range matched {
		if !g.ok(v.Load, p, lo) {
			continue
		}
		if k > bestK || (k == bestK && k > 0 && v.Load[p] < v.Load[best]) {
			best, bestK = p, k
		}
	}
	if best < 0 || float64(min(bestK*v.BlockSize, q.InputLength)) < minMatch*float64(q.InputLength) {
		return leastLoaded(v.Load, next)
	}
	return best
}

// approxRouter is the Gateway API Inference Extension's approximate-prefix proposal: an approximate router-side prefix
// index from routing history, one LRU of Capacity blocks per pod (mimicking
// the engine's LRU), longest-prefix match; the affinity is used only when the
// match covers at least MinMatch of the prompt and the pod passes the load
// guard, otherwise least-loaded. Ties: more matched, then less loaded.
type approxRouter struct {
	noEvents
	lrus     podLRUs
	Guard    loadGuard
	MinMatch float64
	next     int
	scratch  []uint64
	matched  []int
}

func newApproxRouter(pods, capacity int, guard loadGuard, minMatch float64) *approxRouter {
	return &approxRouter{lrus: newPodLRUs(pods, capacity), Guard: guard, MinMatch: minMatch}
}

func (*approxRouter) name() string { return "approx-prefix" }

func (r *approxRouter) route(q *Request, v *view) int {
	r.matched = r.matched[:0]
	for p := range v.Load {
		r.matched = append(r.matched, r.lrus.prefix(p, q.HashIDs))
	}
	best := affinityChoice(r.matched, q, v, r.Guard, r.MinMatch, &r.next)
	r.scratch = r.lrus.record(best, q.HashIDs, r.scratch)
	return best
}

// aibrixRouter is AIBrix's prefix-cache routing. A router-side
// table maps block hash -> pods it was routed to, bounded by BlockNumber
// entries (AIBRIX_PREFIX_CACHE_BLOCK_NUMBER, default 200000) with LRU
// eviction. Per request:
//  1. if max-min running requests > ImbalanceAbs (default 16): least loaded;
//  2. else each pod's prefix match percent = leading matched blocks / blocks;
//     matched pods sorted by percent desc, then running asc; the first with
//     running <= mean + LoadFactor*stddev (default 2) wins;
//  3. otherwise least loaded. The chosen pod is added to the request's blocks.
//
// The seed's pseudocode compares with "<" and its configuration text with
// "<="; we use "<=", which is what makes a perfectly balanced fleet (stddev 0)
// still follow the cache.
type aibrixRouter struct {
	noEvents
	ImbalanceAbs int
	LoadFactor   float64
	table        map[uint64]uint64 // hash -> bitset of pods (<= 64 pods)
	lru          *cache.LRU
	next         int
	scratch      []uint64
	cands        []aibrixCand
}

type aibrixCand struct {
	pod, running int
	pct          float64
}

func newAIBrixRouter(imbalanceAbs int, loadFactor float64, blockNumber int) *aibrixRouter {
	return &aibrixRouter{ImbalanceAbs: imbalanceAbs, LoadFactor: loadFactor,
		table: make(map[uint64]uint64), lru: cache.NewLRU(blockNumber)}
}

func (*aibrixRouter) name() string { return "aibrix" }

func (r *aibrixRouter) route(q *Request, v *view) int {
	lo, hi := minMax(v.Load)
	target := -1
	if hi-lo <= r.ImbalanceAbs && len(q.HashIDs) > 0 {
		// Leading matched blocks per pod: the set of pods holding every block
		// so far shrinks as we walk the prefix.
		r.cands = r.cands[:0]
		alive := uint64(math.MaxUint64)
		var matched [64]int
		for i, h := range q.HashIDs {
			alive &= r.table[h]
			if alive == 0 {
				break
			}
			for p := 0; p < len(v.Load); p++ {
				if alive&(1<<p) != 0 {
					matched[p] = i + 1
				}
			}
		}
		for p := 0; p < len(v.Load); p++ {
			if matched[p] > 0 {
				r.cands = append(r.cands, aibrixCand{p, v.Load[p], 100 * float64(matched[p]) / float64(len(q.HashIDs))})
			}
		}
		if len(r.cands) > 0 {
			sort.SliceStable(r.cands, func(i, j int) bool {
				if r.cands[i].pct != r.cands[j].pct {
					return r.cands[i].pct > r.cands[j].pct
				}
				return r.cands[i].running < r.cands[j].running
			})
			mean, sd := meanStd(v.Load)
			for _, c := range r.cands {
				if float64(c.running) <= mean+r.LoadFactor*sd {
					target = c.pod
					break
				}
			}
		}
	}
	if target < 0 {
		target = leastLoaded(v.Load, &r.next)
	}
	for _, h := range q.HashIDs {
		r.scratch = r.lru.Access(h, r.scratch[:0])
		for _, ev := range r.scratch {
			delete(r.table, ev)
		}
		r.table[h] |= 1 << target
	}
	return target
}

func meanStd(load []int) (mean, sd float64) {
	for _, l := range load {
		mean += float64(l)
	}
	mean /= float64(len(load))
	for _, l := range load {
		d := float64(l) - mean
		sd += d * d
	}
	return mean, math.Sqrt(sd / float64(len(load)))
}

// sglangRouter is SGLang's cache-aware router (sgl-router / SGLang Model
// Gateway). Imbalanced when (max-min) > BalanceAbs AND max > BalanceRel*min:
// then shortest queue. Otherwise the approximate per-worker radix tree (here:
// per-pod LRU over blocks from routing history, the tree's leaves at block
// granularity) gives the longest prefix match; if matched/prompt >
// CacheThreshold route there, else to the pod with the smallest tree (most
// free cache). The request is then inserted into the chosen pod's tree.
// Ties in the longest match (e.g. several trees holding only a shared first
// block) go to the lowest pod index; SGLang takes whichever tenant of the
// matched node its map iterates first, an equally arbitrary fixed choice.
// Defaults from the gateway's CLI: cache_threshold 0.3,
// balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size 2^26
// (characters; we bound each pod's tree at MaxTreeBlocks).
type sglangRouter struct {
	noEvents
	CacheThreshold float64
	BalanceAbs     int
	BalanceRel     float64
	lrus           podLRUs
	next           int
	scratch        []uint64
}

func newSGLangRouter(pods int, cacheThreshold float64, balanceAbs int, balanceRel float64, maxTreeBlocks int) *sglangRouter {
	return &sglangRouter{CacheThreshold: cacheThreshold, BalanceAbs: balanceAbs, BalanceRel: balanceRel,
		lrus: newPodLRUs(pods, maxTreeBlocks)}
}

func (*sglangRouter) name() string { return "sglang" }

func (r *sglangRouter) route(q *Request, v *view) int {
	lo, hi := minMax(v.Load)
	var target int
	if hi-lo > r.BalanceAbs && float64(hi) > r.BalanceRel*float64(lo) {
		target = leastLoaded(v.Load, &r.next)
	} else {
		best, bestK := 0, -1
		for p := range v.Load {
			if k := r.lrus.prefix(p, q.HashIDs); k > bestK {
				best, bestK = p, k
			}
		}
		rate := 0.0
		if q.InputLength > 0 {
			rate = float64(min(bestK*v.BlockSize, q.InputLength)) / float64(q.InputLength)
		}
		if rate > r.CacheThreshold {
			target = best
		} else {
			target = 0
			for p := range v.Load {
				if r.lrus[p].Len() < r.lrus[target].Len() {
					target = p
				}
			}
		}
	}
	r.scratch = r.lrus.record(target, q.HashIDs, r.scratch)
	return target
}

// replicatedRouter runs R independent replicas of one policy, as a router
// deployment with R instances behind a load balancer does: request i is
// decided by replica i mod R using only that replica's own state (its routing
// history), while KV events, which every replica subscribes to, reach all of
// them. Load is the fleet's true load for every replica (optimistic: real
// replicas each know only their own in-flight requests).
type replicatedRouter struct {
	reps  []router
	picks int
}

func newReplicatedRouter(reps []router) *replicatedRouter { return &replicatedRouter{reps: reps} }

func (r *replicatedRouter) name() string {
	return fmt.Sprintf("%s x%d", r.reps[0].name(), len(r.reps))
}

func (r *replicatedRouter) route(q *Request, v *view) int {
	p := r.reps[r.picks%len(r.reps)].route(q, v)
	r.picks++
	return p
}

func (r *replicatedRouter) onKVEvents(pod int, ops []kvOp, now float64) {
	for _, x := range r.reps {
		x.onKVEvents(pod, ops, now)
	}
}
