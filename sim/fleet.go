package sim

import (
	"container/heap"
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/sim/cache"
)

// ServiceModel is the per-pod engine model. It is deliberately simple and
// documented in docs/simulator.md:
//   - a pod runs at most MaxBatch requests at once; more wait in a FIFO;
//   - an admitted request's prefill runs on the pod's single prefill unit
//     (prefill is compute-bound, so prefills of one pod are serialised) and
//     takes PrefillBase + PrefillPerToken * uncached prompt tokens;
//   - decode then takes DecodePerToken * output tokens, concurrently with
//     other requests of the pod (decode is memory-bound and batched);
//   - TTFT = queueing (for a slot and for the prefill unit) + prefill.
type ServiceModel struct {
	MaxBatch        int     // B: concurrent requests per pod
	PrefillBase     float64 // seconds per prefill
	PrefillPerToken float64 // seconds per uncached prompt token
	DecodePerToken  float64 // seconds per output token
}

// DefaultServiceModel is roughly one 8B-class model per GPU: ~20k prefill
// tokens/s, 25 ms per decoded token, 64 concurrent sequences.
func DefaultServiceModel() ServiceModel {
	return ServiceModel{MaxBatch: 64, PrefillBase: 0.010, PrefillPerToken: 0.00005, DecodePerToken: 0.025}
}

// FleetConfig is one simulation run's fleet.
type FleetConfig struct {
	Pods      int
	Cache     cache.Config // per pod
	Service   ServiceModel
	BlockSize int
	Speedup   float64 // arrival time = timestamp / Speedup
	EventLag  float64 // seconds between a pod's prefill end and the router seeing its KV events
}

// kvOp is one KV-cache event a simulated pod emits: a run of blocks stored or
// removed, in the order the pod's cache changed.
type kvOp struct {
	Removed bool
	Blocks  []uint64
}

// view is what a router may look at when it decides: the current time and
// every pod's load (requests routed to it and not finished: queued + running,
// the in-flight count every router tracks for itself).
type view struct {
	Now       float64
	Load      []int
	BlockSize int
}

// router is one routing policy. Route returns the pod for r. OnKVEvents
// delivers a pod's KV events once the event lag has passed; policies that do
// not listen to engines ignore it.
type router interface {
	name() string
	route(r *Request, v *view) int
	onKVEvents(pod int, ops []kvOp, now float64)
}

// result is one policy's outcome.
type result struct {
	Policy          string    `json:"policy"`
	Requests        int       `json:"requests"`
	PromptTokens    int64     `json:"prompt_tokens"`
	HitTokens       int64     `json:"hit_tokens"`
	HitRate         float64   `json:"hit_rate"`
	TTFTp50         float64   `json:"ttft_p50_s"`
	TTFTp90         float64   `json:"ttft_p90_s"`
	TTFTp99         float64   `json:"ttft_p99_s"`
	TTFTMean        float64   `json:"ttft_mean_s"`
	PerPodMax       int       `json:"requests_per_pod_max"`
	PerPodMean      float64   `json:"requests_per_pod_mean"`
	PerPod          []int     `json:"requests_per_pod"`
	CacheBlocksUsed int       `json:"cache_blocks_used"` // sum over pods at the end
	CachePerPod     []int     `json:"cache_blocks_per_pod"`
	Makespan        float64   `json:"makespan_s"`
	WallSeconds     float64   `json:"wall_seconds"`
	TTFTs           []float64 `json:"-"`
}

type evKind uint8

const (
	evArrival evKind = iota
	evPrefillDone
	evDecodeDone
	evKVDelivery
)

type simEvent struct {
	t    float64
	seq  uint64 // FIFO among equal times: determinism
	kind evKind
	pod  int
	req  int
	ops  []kvOp
	gen  uint64 // the P/D fleet's decode events: stale unless equal to the pod's generation
}

type eventHeap []simEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type pod struct {
	cache       cache.Policy
	waiting     []int // requests waiting for a slot
	prefillQ    []int // admitted, waiting for the prefill unit
	running     int   // admitted (prefill or decode)
	prefillBusy bool
}

type fleet struct {
	cfg     FleetConfig
	reqs    []Request
	router  router
	pods    []pod
	events  eventHeap
	seq     uint64
	view    view
	arrival []float64
	res     result
	scratch []uint64
}

func (f *fleet) push(e simEvent) {
	f.seq++
	e.seq = f.seq
	heap.Push(&f.events, e)
}

// simulate runs the whole trace through the fleet with router. It is
// deterministic: same inputs and seeds, same result.
func simulate(cfg FleetConfig, reqs []Request, router router) (result, error) {
	if cfg.Pods < 1 {
		return result{}, fmt.Errorf("sim: need at least one pod")
	}
	if cfg.Service.MaxBatch < 1 {
		return result{}, fmt.Errorf("sim: max batch must be >= 1")
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	if cfg.BlockSize < 1 {
		return result{}, fmt.Errorf("sim: block size must be >= 1")
	}
	f := &fleet{cfg: cfg, reqs: reqs, router: router, pods: make([]pod, cfg.Pods)}
	for i := range f.pods {
		c, err := cache.New(cfg.Cache)
		if err != nil {
			return result{}, err
		}
		f.pods[i].cache = c
	}
	f.view = view{Load: make([]int, cfg.Pods), BlockSize: cfg.BlockSize}
	f.arrival = make([]float64, len(reqs))
	f.res = result{Policy: router.name(), Requests: len(reqs), PerPod: make([]int, cfg.Pods), TTFTs: make([]float64, 0, len(reqs))}
	var t0 int64
	if len(reqs) > 0 {
		t0 = reqs[0].Timestamp
	}
	for i := range reqs {
		at := float64(reqs[i].Timestamp-t0) / 1000 / cfg.Speedup
		f.arrival[i] = at
		f.push(simEvent{t: at, kind: evArrival, req: i})
	}
	for f.events.Len() > 0 {
		e := heap.Pop(&f.events).(simEvent)
		f.view.Now = e.t
		switch e.kind {
		case evArrival:
			p := router.route(&reqs[e.req], &f.view)
			if p < 0 || p >= cfg.Pods {
				return result{}, fmt.Errorf("sim: router %s returned pod %d of %d", router.name(), p, cfg.Pods)
			}
			f.view.Load[p]++
			f.res.PerPod[p]++
			f.pods[p].waiting = append(f.pods[p].waiting, e.req)
			f.admit(p)
		case evPrefillDone:
			pd := &f.pods[e.pod]
			pd.prefillBusy = false
			if len(e.ops) > 0 {
				f.push(simEvent{t: e.t + cfg.EventLag, kind: evKVDelivery, pod: e.pod, ops: e.ops})
			}
			f.push(simEvent{t: e.t + float64(reqs[e.req].OutputLength)*cfg.Service.DecodePerToken, kind: evDecodeDone, pod: e.pod, req: e.req})
			f.startPrefill(e.pod)
		case evDecodeDone:
			f.pods[e.pod].running--
			f.view.Load[e.pod]--
			f.res.Makespan = e.t
			f.admit(e.pod)
		case evKVDelivery:
			router.onKVEvents(e.pod, e.ops, e.t)
		}
	}
	f.finish()
	return f.res, nil
}

// admit moves waiting requests into free slots.
func (f *fleet) admit(p int) {
	pd := &f.pods[p]
	for pd.running < f.cfg.Service.MaxBatch && len(pd.waiting) > 0 {
		r := pd.waiting[0]
		pd.waiting = pd.waiting[1:]
		pd.running++
		pd.prefillQ = append(pd.prefillQ, r)
	}
	f.startPrefill(p)
}

// startPrefill runs the next prefill if the unit is idle. The cache is looked
// up and updated when the prefill is scheduled (the engine allocates and pins
// the request's blocks then); the resulting KV events leave the pod when the
// prefill completes.
func (f *fleet) startPrefill(p int) {
	pd := &f.pods[p]
	if pd.prefillBusy || len(pd.prefillQ) == 0 {
		return
	}
	ri := pd.prefillQ[0]
	pd.prefillQ = pd.prefillQ[1:]
	pd.prefillBusy = true
	r := &f.reqs[ri]
	_, hit := prefixHit(pd.cache, r, f.cfg.BlockSize)
	var ops []kvOp
	for _, h := range r.HashIDs {
		was := pd.cache.Contains(h)
		f.scratch = pd.cache.Access(h, f.scratch[:0])
		for _, ev := range f.scratch {
			ops = appendOp(ops, true, ev)
		}
		if !was && pd.cache.Contains(h) {
			ops = appendOp(ops, false, h)
		}
	}
	now := f.view.Now
	dur := f.cfg.Service.PrefillBase + float64(r.InputLength-hit)*f.cfg.Service.PrefillPerToken
	f.res.PromptTokens += int64(r.InputLength)
	f.res.HitTokens += int64(hit)
	f.res.TTFTs = append(f.res.TTFTs, now+dur-f.arrival[ri])
	f.push(simEvent{t: now + dur, kind: evPrefillDone, pod: p, req: ri, ops: ops})
}

func appendOp(ops []kvOp, removed bool, h uint64) []kvOp {
	if n := len(ops); n > 0 && ops[n-1].Removed == removed {
		ops[n-1].Blocks = append(ops[n-1].Blocks, h)
		return ops
	}
	return append(ops, kvOp{Removed: removed, Blocks: []uint64{h}})
}

func (f *fleet) finish() {
	r := &f.res
	if r.PromptTokens > 0 {
		r.HitRate = float64(r.HitTokens) / float64(r.PromptTokens)
	}
	s := slices.Clone(r.TTFTs)
	slices.Sort(s)
	r.TTFTp50, r.TTFTp90, r.TTFTp99 = quantile(s, 0.50), quantile(s, 0.90), quantile(s, 0.99)
	var sum float64
	for _, v := range s {
		sum += v
	}
	if len(s) > 0 {
		r.TTFTMean = sum / float64(len(s))
	}
	for _, n := range r.PerPod {
		r.PerPodMax = max(r.PerPodMax, n)
	}
	r.PerPodMean = float64(r.Requests) / float64(len(r.PerPod))
	for i := range f.pods {
		r.CachePerPod = append(r.CachePerPod, f.pods[i].cache.Len())
		r.CacheBlocksUsed += f.pods[i].cache.Len()
	}
}

// quantile is the nearest-rank quantile of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}
