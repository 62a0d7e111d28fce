package routing

import (
	"errors"
	"math"
)

// CostParams are the cost model's knobs.
type CostParams struct {
	// OverlapWeight prices one block of prefill against one block of decode
	// load (Dynamo's --kv-overlap-score-weight, default 1). Higher favours
	// cache hits (TTFT), lower favours even load (ITL); 0 ignores the cache.
	OverlapWeight float64
	// BlocksPerRequest is the KV blocks one in-flight request is assumed to
	// occupy; 0 = the request's own size (a fleet serving similar requests).
	BlocksPerRequest float64
}

// Cost is a cost model in the spirit of NVIDIA Dynamo's KV router
// (lib/llm/src/kv_router scheduler; docs "KV Cache Routing"): the pod with
// the lowest
//
//	cost = OverlapWeight * prefill_blocks + decode_blocks
//	prefill_blocks = Blocks - Cached                (tier-credited)
//	decode_blocks  = (Running + Waiting) * BlocksPerRequest + Blocks - Matched
//
// wins; ties go to the less loaded, then to the earlier candidate. Dynamo
// counts the blocks of every active sequence on a worker plus the new
// request's blocks that the worker's sequences do not already share; a
// router here reports request counts, so each in-flight request is assumed
// to hold BlocksPerRequest blocks (default: as many as this request), and
// the blocks the pod already holds stand for the shared ones. Tier credits:
// Cached weighs a block found on CPU or disk below one on GPU, so a slower
// hit saves less prefill. Dynamo's optional softmax sampling
// (--router-temperature > 0) is not implemented: its default, 0, is this
// deterministic argmin. Defaults: OverlapWeight 1, BlocksPerRequest 0.
// Score = Cached; Cost = cost.
type Cost struct{ params CostParams }

func newCost(p CostParams) (*Cost, error) {
	if !finite(p.OverlapWeight, p.BlocksPerRequest) {
		return nil, errors.New("cost: overlap weight and blocks per request must be finite and >= 0")
	}
	return &Cost{p}, nil
}

func (*Cost) Name() string { return NameCost }

func (p *Cost) Pick(req Request, c []Candidate) (int, Reason) {
	per := p.params.BlocksPerRequest
	if per == 0 {
		per = float64(max(req.Blocks, 1))
	}
	best := 0
	for i := range c {
		x := &c[i]
		prefill := math.Max(float64(req.Blocks)-x.Cached, 0)
		x.Score = x.Cached
		x.Cost = p.params.OverlapWeight*prefill + float64(x.InFlight())*per + float64(max(req.Blocks-x.Matched, 0))
		if i > 0 && (x.Cost < c[best].Cost || (x.Cost == c[best].Cost && lessLoaded(x, &c[best]))) {
			best = i
		}
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	return best, ReasonLowestCost
}

// WeightedParams are the weights of the three scorers.
type WeightedParams struct {
	Prefix, Queue, KVUsage float64
}

// Weighted is llm-d's scheduling profile of weighted scorers with a
// max-score picker (llm-d-inference-scheduler; the Gateway API Inference
// Extension's queue and kv-cache-utilization scorers):
//
//	score = Prefix*prefix + Queue*queue + KVUsage*kv
//	prefix = (Cached - min) / (max - min) over candidates that cache
//	         something, 1 when they all cache the same, 0 for the others
//	         (llm-d's precise-prefix-cache-scorer normalisation)
//	queue  = (maxWaiting - Waiting) / (maxWaiting - minWaiting), 1 when all
//	         equal (GIE queue-scorer: waiting queue only)
//	kv     = 1 - KVUsage                  (GIE kv-cache-utilization-scorer)
//
// The highest score wins; ties go to the less loaded, then to the earlier
// candidate (llm-d's max-score picker breaks ties at random). Defaults are
// llm-d's precise-prefix-cache guide: Prefix 3, Queue 2, KVUsage 2.
// Score = score; Cost = in-flight requests.
type Weighted struct{ params WeightedParams }

func newWeighted(p WeightedParams) (*Weighted, error) {
	if !finite(p.Prefix, p.Queue, p.KVUsage) {
		return nil, errors.New("weighted: weights must be finite and >= 0")
	}
	return &Weighted{p}, nil
}

func (*Weighted) Name() string { return NameWeighted }

func (p *Weighted) Pick(_ Request, c []Candidate) (int, Reason) {
	minC, maxC := math.Inf(1), math.Inf(-1)
	minW, maxW := math.MaxInt, math.MinInt
	for i := range c {
		if x := c[i].Cached; x > 0 {
			minC, maxC = math.Min(minC, x), math.Max(maxC, x)
		}
		minW, maxW = min(minW, c[i].Waiting), max(maxW, c[i].Waiting)
	}
	best := 0
	for i := range c {
		x := &c[i]
		prefix := 0.0
		if x.Cached > 0 {
			prefix = 1
			if maxC > minC {
				prefix = (x.Cached - minC) / (maxC - minC)
			}
		}
		queue := 1.0
		if maxW > minW {
			queue = float64(maxW-x.Waiting) / float64(maxW-minW)
		}
		kv := 1 - math.Min(math.Max(x.KVUsage, 0), 1)
		x.Score = p.params.Prefix*prefix + p.params.Queue*queue + p.params.KVUsage*kv
		x.Cost = float64(x.InFlight())
		if i > 0 && (x.Score > c[best].Score || (x.Score == c[best].Score && lessLoaded(x, &c[best]))) {
			best = i
		}
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	return best, ReasonHighestScore
}

// AIBrixParams are the two load guards.
type AIBrixParams struct {
	// ImbalanceAbs: when max - min running requests exceeds it, prefix is
	// ignored (AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT,
	// default 16).
	ImbalanceAbs int
	// StdDevFactor: a pod caching the prefix is eligible only while
	// running <= mean + StdDevFactor*stddev of running over the candidates
	// (AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR, default 2).
	StdDevFactor float64
}

// AIBrix is AIBrix's prefix-cache routing (vllm-project/aibrix gateway
// prefix_cache algorithm):
//  1. if max(Running) - min(Running) > ImbalanceAbs: least running
//     (ReasonImbalanced);
//  2. else among candidates with Matched > 0, ordered by match percent
//     (Matched/Blocks) descending then Running ascending, the first with
//     Running <= mean + StdDevFactor*stddev wins (ReasonPrefix);
//  3. otherwise least running (ReasonNoMatch when nobody matched,
//     ReasonOverloaded when every holder failed the guard).
//
// AIBrix's configuration text states the guard with "<=", which also keeps
// a perfectly balanced fleet (stddev 0) following the cache. Defaults:
// ImbalanceAbs 16, StdDevFactor 2. Score = match percent (0..100); Cost =
// Running.
type AIBrix struct{ params AIBrixParams }

func newAIBrix(p AIBrixParams) (*AIBrix, error) {
	if p.ImbalanceAbs < 0 || !finite(p.StdDevFactor) {
		return nil, errors.New("aibrix: imbalance threshold and stddev factor must be >= 0")
	}
	return &AIBrix{p}, nil
}

func (*AIBrix) Name() string { return NameAIBrix }

func (p *AIBrix) Pick(req Request, c []Candidate) (int, Reason) {
	lo, hi := math.MaxInt, math.MinInt
	var sum float64
	for i := range c {
		x := &c[i]
		lo, hi = min(lo, x.Running), max(hi, x.Running)
		sum += float64(x.Running)
		x.Score, x.Cost = 0, float64(x.Running)
		if req.Blocks > 0 {
			x.Score = 100 * float64(x.Matched) / float64(req.Blocks)
		}
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	if hi-lo > p.params.ImbalanceAbs {
		return leastRunning(c), ReasonImbalanced
	}
	mean := sum / float64(len(c))
	var v float64
	for i := range c {
		d := float64(c[i].Running) - mean
		v += d * d
	}
	limit := mean + p.params.StdDevFactor*math.Sqrt(v/float64(len(c)))
	best, holders := -1, 0
	for i := range c {
		x := &c[i]
		if x.Matched == 0 {
			continue
		}
		holders++
		if float64(x.Running) > limit {
			continue
		}
		if best < 0 || x.Matched > c[best].Matched || (x.Matched == c[best].Matched && x.Running < c[best].Running) {
			best = i
		}
	}
	switch {
	case best >= 0:
		return best, ReasonPrefix
	case holders == 0:
		return leastRunning(c), ReasonNoMatch
	}
	return leastRunning(c), ReasonOverloaded
}

// leastRunning is AIBrix's fallback: fewest running requests, then earlier.
func leastRunning(c []Candidate) int {
	best := 0
	for i := range c {
		if c[i].Running < c[best].Running {
			best = i
		}
	}
	return best
}

// SGLangParams are the cache-aware router's thresholds.
type SGLangParams struct {
	// BalanceAbs and BalanceRel: the fleet is imbalanced when
	// max - min > BalanceAbs AND max > BalanceRel * min (in-flight
	// requests); defaults 64 and 1.5.
	BalanceAbs int
	BalanceRel float64
	// CacheThreshold: follow the cache only when the best match covers more
	// than this share of the prompt (default 0.3).
	CacheThreshold float64
}

// SGLang is SGLang's cache-aware policy (sgl-project/sglang router,
// cache_aware): when the fleet is imbalanced (see SGLangParams) the least
// loaded pod wins (ReasonImbalanced). Otherwise the longest match (ties:
// less loaded, then earlier) wins when
// min(Matched*BlockSize, Tokens)/Tokens > CacheThreshold (ReasonPrefix);
// below it SGLang sends the request to the worker whose tree is smallest,
// i.e. with the most free cache, which here is the lowest KVUsage (ties:
// less loaded; ReasonNoMatch). Load is the in-flight count the router keeps
// per worker, here Running + Waiting. Defaults are the router's CLI
// defaults: BalanceAbs 64, BalanceRel 1.5, CacheThreshold 0.3. Score =
// match rate; Cost = in-flight requests.
type SGLang struct{ params SGLangParams }

func newSGLang(p SGLangParams) (*SGLang, error) {
	if p.BalanceAbs < 0 || !finite(p.BalanceRel, p.CacheThreshold) {
		return nil, errors.New("sglang: thresholds must be finite and >= 0")
	}
	return &SGLang{p}, nil
}

func (*SGLang) Name() string { return NameSGLang }

func (p *SGLang) Pick(req Request, c []Candidate) (int, Reason) {
	lo, hi := math.MaxInt, math.MinInt
	best := 0
	tokens := max(req.Tokens, req.Blocks*req.BlockSize)
	for i := range c {
		x := &c[i]
		l := x.InFlight()
		lo, hi = min(lo, l), max(hi, l)
		x.Cost, x.Score = float64(l), 0
		if tokens > 0 {
			x.Score = float64(min(x.Matched*req.BlockSize, tokens)) / float64(tokens)
		}
		if x.Matched > c[best].Matched || (x.Matched == c[best].Matched && lessLoaded(x, &c[best])) {
			best = i
		}
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	if hi-lo > p.params.BalanceAbs && float64(hi) > p.params.BalanceRel*float64(lo) {
		return leastLoaded(c, -1), ReasonImbalanced
	}
	if c[best].Score > p.params.CacheThreshold {
		return best, ReasonPrefix
	}
	free := 0
	for i := range c {
		if c[i].KVUsage < c[free].KVUsage || (c[i].KVUsage == c[free].KVUsage && c[i].InFlight() < c[free].InFlight()) {
			free = i
		}
	}
	return free, ReasonNoMatch
}

// GuardedPrefixParams are the guard of GuardedPrefix.
type GuardedPrefixParams struct {
	// GuardAbs: a pod is eligible while its in-flight requests are
	// <= the fleet minimum + GuardAbs (default 4); negative disables it.
	GuardAbs int
	// MinMatch: follow the cache only when the match covers at least this
	// share of the request's blocks (default 0: any match).
	MinMatch float64
}

// GuardedPrefix is the simulator's original precise policy, the GIE
// approximate-prefix proposal's "prefix affinity only within a load bound":
// among candidates whose in-flight requests are <= min + GuardAbs, the
// longest match wins (ties: less loaded, then earlier; ReasonPrefix); the
// least loaded pod wins when no eligible candidate matches at least
// MinMatch of the blocks (ReasonNoMatch, or ReasonOverloaded when a holder
// was left out by the guard). Defaults: GuardAbs 4, MinMatch 0. Score =
// Matched; Cost = in-flight requests.
type GuardedPrefix struct{ params GuardedPrefixParams }

func newGuardedPrefix(p GuardedPrefixParams) (*GuardedPrefix, error) {
	if !finite(p.MinMatch) || p.MinMatch > 1 {
		return nil, errors.New("guarded-prefix: min match must be in [0, 1]")
	}
	return &GuardedPrefix{p}, nil
}

func (*GuardedPrefix) Name() string { return NameGuardedPrefix }

func (p *GuardedPrefix) Pick(req Request, c []Candidate) (int, Reason) {
	lo := math.MaxInt
	for i := range c {
		x := &c[i]
		x.Score, x.Cost = float64(x.Matched), float64(x.InFlight())
		lo = min(lo, x.InFlight())
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	best, guarded := -1, false
	for i := range c {
		x := &c[i]
		if x.Matched == 0 {
			continue
		}
		if p.params.GuardAbs >= 0 && x.InFlight() > lo+p.params.GuardAbs {
			guarded = true
			continue
		}
		if best < 0 || x.Matched > c[best].Matched || (x.Matched == c[best].Matched && lessLoaded(x, &c[best])) {
			best = i
		}
	}
	if best >= 0 && float64(c[best].Matched) >= p.params.MinMatch*float64(req.Blocks) {
		return best, ReasonPrefix
	}
	if guarded && best < 0 {
		return leastLoaded(c, -1), ReasonOverloaded
	}
	return leastLoaded(c, -1), ReasonNoMatch
}
