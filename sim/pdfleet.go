package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/sim/cache"
)

// PDConfig is a prefill/decode-disaggregated fleet (docs/simulator.md,
// "P/D fleet model"). The aggregated router runs the same number of pods,
// PrefillPods + DecodePods, all of role both, so every routing is compared
// on the same hardware.
type PDConfig struct {
	PrefillPods, DecodePods int
	Cache                   cache.Config // per pod
	// Service is the per-pod engine: prefill speed, decode time per token,
	// and MaxBatch, the concurrent requests of an aggregated pod.
	Service ServiceModel
	// DecodeCapacity is the concurrent sequences of a decode pod; more wait
	// for a slot before their KV is pulled (the pod must allocate the
	// blocks it pulls into).
	DecodeCapacity int
	// TransferPerBlock is the time to move one block's KV between two pods
	// (prefill -> decode, or from a kv_source).
	TransferPerBlock float64
	// PD is the conditional router's disaggregation decision (threshold
	// of tokens the decode pod would prefill, prefill-pool queue bound).
	PD        routing.PDParams
	BlockSize int
	Speedup   float64
	EventLag  float64
}

// DefaultPDConfig is the P/D fleet of docs/simulator.md: 4 prefill and 4
// decode pods (8 aggregated), the trace fleet's pod (DefaultServiceModel:
// an 8B-class model on one GPU) with 2,000 cached 512-token blocks each,
// decode pods as wide as an aggregated pod's batch (64, an assumption), a
// transfer of 2.8 ms per 512-token block (64 MiB of an 8B-class model's
// KV, 128 KiB per token, at the 23.75 GB/s per 400 Gb/s NIC that Mooncake's
// transfer engine reports: 190 GB/s on 8 x 400 Gbps RoCE), and package
// routing's default disaggregation decision.
func DefaultPDConfig() PDConfig {
	return PDConfig{PrefillPods: 4, DecodePods: 4, Cache: cache.Config{Policy: "lru", Capacity: 2000},
		Service: DefaultServiceModel(), DecodeCapacity: 64, TransferPerBlock: 0.0028, PD: routing.DefaultPD(),
		BlockSize: 512, Speedup: 1, EventLag: 0.1}
}

// PD router names, in table order.
const (
	PDAggregated  = "aggregated"
	PDLoad        = "pd-load"
	PDPrecise     = "pd-precise"
	PDConditional = "pd-conditional"
)

// PDRouterOrder lists the P/D comparison's routers.
var PDRouterOrder = []string{PDAggregated, PDLoad, PDPrecise, PDConditional}

// PDResult is one router's outcome on a P/D fleet.
type PDResult struct {
	Router   string  `json:"router"`
	Requests int     `json:"requests"`
	TTFTp50  float64 `json:"ttft_p50_s"`
	TTFTp90  float64 `json:"ttft_p90_s"`
	TTFTMean float64 `json:"ttft_mean_s"`
	// ITLMean is the mean over requests of (answer end - first token) /
	// (output tokens - 1): what prefills on a pod that decodes cost its
	// decodes.
	ITLMean float64 `json:"itl_mean_s"`
	// OutputTokensPerS is every output token over the makespan (first
	// arrival to last answer).
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	Makespan         float64 `json:"makespan_s"`
	// HitRate is the prompt tokens not computed (cached on the pod that
	// prefilled, or pulled from a kv_source) over all prompt tokens.
	HitRate float64 `json:"hit_rate"`
	// ComputedTokens are the prompt tokens prefilled.
	ComputedTokens int64 `json:"computed_tokens"`
	// Disaggregated counts requests prefilled on a prefill pod; Pulled the
	// blocks read from a kv_source; Transferred the blocks moved from a
	// prefill pod to a decode pod.
	Disaggregated int   `json:"disaggregated"`
	Pulled        int64 `json:"pulled_blocks"`
	Transferred   int64 `json:"transferred_blocks"`
	// DecodeLocalHit is the share of a disaggregated request's blocks its
	// decode pod already held (so they were not transferred).
	DecodeLocalHit float64 `json:"decode_local_hit"`
	// EarlyTurns counts multi-turn requests that arrived before the answer
	// of their previous turn ended (the workload is open loop).
	EarlyTurns  int       `json:"early_turns"`
	WallSeconds float64   `json:"wall_seconds"`
	TTFTs       []float64 `json:"-"`
}

// pdRole is what a pod of the P/D fleet does.
type pdRole uint8

const (
	roleBoth pdRole = iota
	rolePrefill
	roleDecode
)

// pdRoute is a router's decision for one request: the decode pod (the pod
// that answers), the prefill pod (-1: the decode pod prefills itself) and
// the kv_source to pull cached blocks from (-1: none).
type pdRoute struct {
	Decode, Prefill, Source int
}

// pdState is what a P/D router may look at: the time, every pod's role,
// its in-flight requests (routed to it and not done with it) and its slot
// count, and, for routers that use the index, every pod's matched leading
// blocks of the request according to the daemon's index (fed by the pods'
// lagged KV events).
type pdState struct {
	Now     float64
	Roles   []pdRole
	Load    []int
	Slots   []int // concurrency a pod's load is measured against
	Matched []int
	Block   int
}

// candidate fills a routing.Candidate for pod p the way the trace
// simulator's pick routers derive an engine's load from its in-flight
// count: Running = min(in flight, slots), Waiting = the rest, KVUsage =
// Running / slots.
func (s *pdState) candidate(p int, matched bool) routing.Candidate {
	l, n := s.Load[p], s.Slots[p]
	c := routing.Candidate{Load: routing.Load{Running: min(l, n), Waiting: max(l-n, 0), KVUsage: float64(min(l, n)) / float64(n)}}
	if matched {
		c.Matched = s.Matched[p]
		c.Cached = float64(c.Matched)
	}
	return c
}

// pdRouter places one request on a P/D fleet.
type pdRouter interface {
	name() string
	needsIndex() bool
	route(q *Request, s *pdState) pdRoute
}

type pdPod struct {
	role        pdRole
	cache       cache.Policy
	slots       int   // concurrent sequences (both, decode); prefill pods: 1 (the prefill unit)
	used        int   // slots taken
	slotQ       []int // requests waiting for a slot
	prefillQ    []int
	prefillBusy bool
	// The decode clock (vnow): a pod's decodes advance only while it is
	// not prefilling. busyAcc is the prefill time before busySince, the
	// start of the prefill in progress.
	busyAcc, busySince float64
	decodes            decodeHeap
	gen                uint64 // invalidates the pending decode event
}

// vnow is the pod's decode clock at t: real time less the time it spent
// prefilling.
func (p *pdPod) vnow(t float64) float64 {
	b := p.busyAcc
	if p.prefillBusy {
		b += t - p.busySince
	}
	return t - b
}

// decodeHeap holds a pod's decoding requests by the decode-clock time they
// end at.
type decodeHeap []decodeEnd

type decodeEnd struct {
	v   float64
	req int
}

func (h decodeHeap) Len() int { return len(h) }
func (h decodeHeap) Less(i, j int) bool {
	if h[i].v != h[j].v {
		return h[i].v < h[j].v
	}
	return h[i].req < h[j].req
}
func (h decodeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *decodeHeap) Push(x any)   { *h = append(*h, x.(decodeEnd)) }
func (h *decodeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type pdPhase uint8

const (
	phaseLocal  pdPhase = iota // prefilled on its decode pod
	phaseRemote                // prefilled on a prefill pod, then transferred
)

type pdReq struct {
	route   pdRoute
	phase   pdPhase
	pulled  int // leading blocks read from the kv_source
	arrival float64
	finish  float64
	ttft    float64
}

type pdEvKind uint8

const (
	pdArrival pdEvKind = iota
	pdPullDone
	pdPrefillDone
	pdTransferDone
	pdDecodeDone
	pdKVDelivery
)

type pdFleet struct {
	cfg     PDConfig
	reqs    []Request
	router  pdRouter
	index   *preciseRouter // the daemon's index, fed by every pod's events
	pods    []pdPod
	rs      []pdReq
	events  eventHeap
	seq     uint64
	st      pdState
	res     PDResult
	scratch []uint64
	// decode-local hit accounting of disaggregated requests
	localHitBlocks, remoteBlocks int64
	promptTokens, hitTokens      int64
	outputTokens                 int64
	itlSum                       float64
	itlN                         int
}

func (c *PDConfig) validate() error {
	switch {
	case c.PrefillPods < 1 || c.DecodePods < 1 || c.PrefillPods+c.DecodePods > MaxPods:
		return fmt.Errorf("pd: need >= 1 prefill and >= 1 decode pod, at most %d in all", MaxPods)
	case c.Service.MaxBatch < 1 || c.DecodeCapacity < 1:
		return errors.New("pd: max batch and decode capacity must be >= 1")
	case c.BlockSize < 1:
		return errors.New("pd: block size must be >= 1")
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 0):
		return errors.New("pd: speedup must be positive")
	}
	for _, x := range []float64{c.TransferPerBlock, c.EventLag, c.Service.PrefillBase, c.Service.PrefillPerToken, c.Service.DecodePerToken} {
		if !finiteNonNeg(x) {
			return errors.New("pd: times must be finite and >= 0")
		}
	}
	return nil
}

// SimulatePD runs reqs through a P/D fleet behind the named router.
func SimulatePD(cfg PDConfig, reqs []Request, routerName string) (PDResult, error) {
	start := time.Now()
	if err := cfg.validate(); err != nil {
		return PDResult{}, err
	}
	r, err := newPDRouter(routerName, cfg)
	if err != nil {
		return PDResult{}, err
	}
	res, err := simulatePD(cfg, reqs, r)
	res.WallSeconds = time.Since(start).Seconds()
	return res, err
}

// simulatePD runs reqs behind router r (cfg validated).
func simulatePD(cfg PDConfig, reqs []Request, r pdRouter) (PDResult, error) {
	routerName := r.name()
	n := cfg.PrefillPods + cfg.DecodePods
	f := &pdFleet{cfg: cfg, reqs: reqs, router: r, pods: make([]pdPod, n), rs: make([]pdReq, len(reqs))}
	f.st = pdState{Roles: make([]pdRole, n), Load: make([]int, n), Slots: make([]int, n), Matched: make([]int, n), Block: cfg.BlockSize}
	for p := range f.pods {
		c, err := cache.New(cfg.Cache)
		if err != nil {
			return PDResult{}, err
		}
		pd := &f.pods[p]
		pd.cache = c
		switch {
		case routerName == PDAggregated:
			pd.role, pd.slots = roleBoth, cfg.Service.MaxBatch
		case p < cfg.PrefillPods:
			pd.role, pd.slots = rolePrefill, 1
		default:
			pd.role, pd.slots = roleDecode, cfg.DecodeCapacity
		}
		f.st.Roles[p], f.st.Slots[p] = pd.role, pd.slots
	}
	if r.needsIndex() {
		var err error
		if f.index, err = newPreciseRouter(n, cfg.BlockSize, loadGuard{-1}, 0, false, 0); err != nil {
			return PDResult{}, err
		}
	}
	f.res = PDResult{Router: routerName, Requests: len(reqs), TTFTs: make([]float64, 0, len(reqs))}
	var t0 int64
	if len(reqs) > 0 {
		t0 = reqs[0].Timestamp
	}
	for i := range reqs {
		if need := len(reqs[i].HashIDs) + len(reqs[i].OutputHashIDs); need > cfg.Cache.Capacity {
			return PDResult{}, fmt.Errorf("pd: request %d has %d blocks, more than a pod's cache of %d", i, need, cfg.Cache.Capacity)
		}
		at := float64(reqs[i].Timestamp-t0) / 1000 / cfg.Speedup
		f.rs[i].arrival = at
		f.push(simEvent{t: at, kind: evKind(pdArrival), req: i})
	}
	for f.events.Len() > 0 {
		e := heap.Pop(&f.events).(simEvent)
		f.st.Now = e.t
		if err := f.handle(e); err != nil {
			return PDResult{}, err
		}
	}
	f.finish()
	return f.res, nil
}

func (f *pdFleet) push(e simEvent) {
	f.seq++
	e.seq = f.seq
	heap.Push(&f.events, e)
}

func (f *pdFleet) handle(e simEvent) error {
	now := e.t
	switch pdEvKind(e.kind) {
	case pdArrival:
		return f.arrive(e.req)
	case pdPullDone:
		pd := &f.pods[e.pod]
		pd.prefillQ = append(pd.prefillQ, e.req)
		f.startPrefill(e.pod)
	case pdPrefillDone:
		pd := &f.pods[e.pod]
		pd.busyAcc += now - pd.busySince
		pd.prefillBusy = false
		f.scheduleDecode(e.pod)
		f.emit(e.pod, e.ops, now)
		rq := &f.rs[e.req]
		if rq.phase == phaseLocal {
			f.firstToken(e.req, now)
			f.startDecode(e.pod, e.req)
		} else {
			f.st.Load[e.pod]--
			d := rq.route.Decode
			f.pods[d].slotQ = append(f.pods[d].slotQ, e.req)
			f.admit(d)
		}
		f.startPrefill(e.pod)
	case pdTransferDone:
		// vLLM caches the received blocks on the decode pod once the pull
		// completes (Scheduler._update_waiting_for_remote_kv) and publishes
		// them as BlockStored like any other cached block.
		f.emit(e.pod, f.access(e.pod, f.reqs[e.req].HashIDs, nil), now)
		// The decode pod computes the prompt's last token itself (vLLM
		// recomputes it when every prompt token was loaded): one decode
		// step before the first token.
		f.firstToken(e.req, now+f.cfg.Service.DecodePerToken)
		f.startDecode(e.pod, e.req)
	case pdDecodeDone:
		pd := &f.pods[e.pod]
		if e.gen != pd.gen {
			return nil // superseded: the pod started prefilling, or another decode began
		}
		v := pd.vnow(now)
		for pd.decodes.Len() > 0 && pd.decodes[0].v <= v+1e-9 {
			i := heap.Pop(&pd.decodes).(decodeEnd).req
			pd.used--
			f.st.Load[e.pod]--
			rq := &f.rs[i]
			rq.finish = now
			if n := f.reqs[i].OutputLength; n > 1 {
				f.itlSum += (now - rq.arrival - rq.ttft) / float64(n-1)
				f.itlN++
			}
			f.outputTokens += int64(f.reqs[i].OutputLength)
			f.res.Makespan = max(f.res.Makespan, now)
			f.emit(e.pod, f.access(e.pod, f.reqs[i].OutputHashIDs, nil), now)
		}
		f.scheduleDecode(e.pod)
		f.admit(e.pod)
	case pdKVDelivery:
		if f.index != nil {
			f.index.onKVEvents(e.pod, e.ops, now)
		}
	}
	return nil
}

// emit sends a pod's KV events to the index after the event lag.
func (f *pdFleet) emit(pod int, ops []kvOp, now float64) {
	if len(ops) > 0 && f.index != nil {
		f.push(simEvent{t: now + f.cfg.EventLag, kind: evKind(pdKVDelivery), pod: pod, ops: ops})
	}
}

// access touches hashes in pod's cache in order and returns the cache's
// changes as KV events appended to ops.
func (f *pdFleet) access(pod int, hashes []uint64, ops []kvOp) []kvOp {
	c := f.pods[pod].cache
	for _, h := range hashes {
		was := c.Contains(h)
		f.scratch = c.Access(h, f.scratch[:0])
		for _, ev := range f.scratch {
			ops = appendOp(ops, true, ev)
		}
		if !was && c.Contains(h) {
			ops = appendOp(ops, false, h)
		}
	}
	return ops
}

// prefix is how many leading blocks of hashes pod's cache holds.
func (f *pdFleet) prefix(pod int, hashes []uint64) int {
	c := f.pods[pod].cache
	k := 0
	for k < len(hashes) && c.Contains(hashes[k]) {
		k++
	}
	return k
}

func (f *pdFleet) arrive(i int) error {
	q := &f.reqs[i]
	if f.index != nil {
		f.index.match(q.HashIDs, f.st.Matched)
	}
	rt := f.router.route(q, &f.st)
	n := len(f.pods)
	switch {
	case rt.Decode < 0 || rt.Decode >= n || f.pods[rt.Decode].role == rolePrefill:
		return fmt.Errorf("pd: router %s chose decode pod %d", f.router.name(), rt.Decode)
	case rt.Prefill >= n || (rt.Prefill >= 0 && f.pods[rt.Prefill].role != rolePrefill):
		return fmt.Errorf("pd: router %s chose prefill pod %d", f.router.name(), rt.Prefill)
	case rt.Source >= n || rt.Source == rt.prefiller():
		return fmt.Errorf("pd: router %s named kv_source %d", f.router.name(), rt.Source)
	}
	rq := &f.rs[i]
	rq.route = rt
	f.st.Load[rt.Decode]++
	if rt.Prefill < 0 {
		rq.phase = phaseLocal
		d := &f.pods[rt.Decode]
		d.slotQ = append(d.slotQ, i)
		f.admit(rt.Decode)
		return nil
	}
	rq.phase = phaseRemote
	f.res.Disaggregated++
	f.st.Load[rt.Prefill]++
	f.toPrefill(i, rt.Prefill)
	return nil
}

// prefiller is the pod that computes the prompt.
func (rt pdRoute) prefiller() int {
	if rt.Prefill >= 0 {
		return rt.Prefill
	}
	return rt.Decode
}

// toPrefill queues request i for pod's prefill unit, after pulling from its
// kv_source the leading blocks the source holds beyond the pod's own. The
// pull reads what the source actually holds now, whatever the index said:
// a connector gets only blocks that are there.
func (f *pdFleet) toPrefill(i, pod int) {
	rq := &f.rs[i]
	if s := rq.route.Source; s >= 0 {
		hs := f.reqs[i].HashIDs
		have, src := f.prefix(pod, hs), f.prefix(s, hs)
		if src > have {
			rq.pulled = src
			f.res.Pulled += int64(src - have)
			f.emit(pod, f.access(pod, hs[:src], nil), f.st.Now)
			f.push(simEvent{t: f.st.Now + float64(src-have)*f.cfg.TransferPerBlock, kind: evKind(pdPullDone), pod: pod, req: i})
			return
		}
	}
	f.pods[pod].prefillQ = append(f.pods[pod].prefillQ, i)
	f.startPrefill(pod)
}

// admit gives free slots of pod p to waiting requests in FIFO order: a
// local request goes on to its prefill, a disaggregated one to its KV
// transfer (the blocks the decode pod lacks, from the prefill pod).
func (f *pdFleet) admit(p int) {
	pd := &f.pods[p]
	for pd.used < pd.slots && len(pd.slotQ) > 0 {
		i := pd.slotQ[0]
		pd.slotQ = pd.slotQ[1:]
		pd.used++
		if f.rs[i].phase == phaseLocal {
			f.toPrefill(i, p)
			continue
		}
		hs := f.reqs[i].HashIDs
		have := f.prefix(p, hs)
		f.localHitBlocks += int64(have)
		f.remoteBlocks += int64(len(hs))
		f.res.Transferred += int64(len(hs) - have)
		f.push(simEvent{t: f.st.Now + float64(len(hs)-have)*f.cfg.TransferPerBlock, kind: evKind(pdTransferDone), pod: p, req: i})
	}
}

// startPrefill runs pod p's next prefill if its unit is idle. The hit is
// the longest cached prefix (pulled blocks included) when the prefill
// starts; as in the trace fleet model the request's blocks enter the cache
// then and their events leave the pod when the prefill ends.
func (f *pdFleet) startPrefill(p int) {
	pd := &f.pods[p]
	if pd.prefillBusy || len(pd.prefillQ) == 0 {
		return
	}
	i := pd.prefillQ[0]
	pd.prefillQ = pd.prefillQ[1:]
	pd.prefillBusy, pd.busySince = true, f.st.Now
	f.scheduleDecode(p) // the decodes stand still while it prefills
	q := &f.reqs[i]
	k := max(f.prefix(p, q.HashIDs), f.rs[i].pulled)
	hit := min(k*f.cfg.BlockSize, q.InputLength)
	ops := f.access(p, q.HashIDs, nil)
	f.promptTokens += int64(q.InputLength)
	f.hitTokens += int64(hit)
	f.res.ComputedTokens += int64(q.InputLength - hit)
	dur := f.cfg.Service.PrefillBase + float64(q.InputLength-hit)*f.cfg.Service.PrefillPerToken
	f.push(simEvent{t: f.st.Now + dur, kind: evKind(pdPrefillDone), pod: p, req: i, ops: ops})
}

// startDecode starts request i's decode on pod p: OutputLength tokens at
// DecodePerToken each on the pod's decode clock.
func (f *pdFleet) startDecode(p, i int) {
	pd := &f.pods[p]
	heap.Push(&pd.decodes, decodeEnd{v: pd.vnow(f.st.Now) + float64(f.reqs[i].OutputLength)*f.cfg.Service.DecodePerToken, req: i})
	f.scheduleDecode(p)
}

// scheduleDecode replaces pod p's pending decode event by one at the real
// time its first decode ends, unless it is prefilling (its decode clock
// stands still until the prefill ends).
func (f *pdFleet) scheduleDecode(p int) {
	pd := &f.pods[p]
	pd.gen++
	if pd.prefillBusy || pd.decodes.Len() == 0 {
		return
	}
	t := f.st.Now + max(pd.decodes[0].v-pd.vnow(f.st.Now), 0)
	f.push(simEvent{t: t, kind: evKind(pdDecodeDone), pod: p, gen: pd.gen})
}

func (f *pdFleet) firstToken(i int, at float64) {
	f.rs[i].ttft = at - f.rs[i].arrival
	f.res.TTFTs = append(f.res.TTFTs, f.rs[i].ttft)
}

func (f *pdFleet) finish() {
	r := &f.res
	s := slices.Clone(r.TTFTs)
	slices.Sort(s)
	r.TTFTp50, r.TTFTp90 = quantile(s, 0.5), quantile(s, 0.9)
	var sum float64
	for _, v := range s {
		sum += v
	}
	if len(s) > 0 {
		r.TTFTMean = sum / float64(len(s))
	}
	first := 0.0
	if len(f.rs) > 0 {
		first = f.rs[0].arrival
	}
	if span := r.Makespan - first; span > 0 {
		r.OutputTokensPerS = float64(f.outputTokens) / span
	}
	if f.itlN > 0 {
		r.ITLMean = f.itlSum / float64(f.itlN)
	}
	if f.promptTokens > 0 {
		r.HitRate = float64(f.hitTokens) / float64(f.promptTokens)
	}
	if f.remoteBlocks > 0 {
		r.DecodeLocalHit = float64(f.localHitBlocks) / float64(f.remoteBlocks)
	}
	for i := range f.reqs {
		if p := f.reqs[i].prev; p > 0 && f.rs[i].arrival < f.rs[p-1].finish {
			r.EarlyTurns++
		}
	}
}

// newPDRouter builds a P/D router by name. Every one is package
// routing's PickPD (and KVSource), the code the daemon's Pick runs; they
// differ in the policy of each stage, the decision's parameters and
// whether they read the index:
//
//   - aggregated: every pod of role both, the daemon's default policy with
//     the index (PickPD is then exactly the policy's Pick): today's precise
//     routing.
//   - pd-load: least-loaded for both stages, no index, and a decision that
//     always disaggregates (MaxLocalPrefillTokens 0, no pool check).
//   - pd-precise: the default policy with the index for both stages,
//     always disaggregating, and a kv_source when a third pod holds more.
//   - pd-conditional: pd-precise with the configured decision (threshold
//     and prefill-pool check).
func newPDRouter(name string, cfg PDConfig) (pdRouter, error) {
	if err := cfg.PD.Validate(); err != nil {
		return nil, err
	}
	always := routing.PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: -1}
	def, err := routing.New(routing.DefaultPolicy, routing.Defaults())
	if err != nil {
		return nil, err
	}
	switch name {
	case PDAggregated:
		return &pdPickRouter{nm: name, pol: def, pd: cfg.PD, index: true}, nil
	case PDLoad:
		return &pdPickRouter{nm: name, pol: routing.LeastLoaded{}, pd: always}, nil
	case PDPrecise:
		return &pdPickRouter{nm: name, pol: def, pd: always, index: true, source: true}, nil
	case PDConditional:
		return &pdPickRouter{nm: name, pol: def, pd: cfg.PD, index: true, source: true}, nil
	}
	return nil, fmt.Errorf("pd: unknown router %q (want one of %v)", name, PDRouterOrder)
}

// pdPickRouter asks routing.PickPD for the pair and routing.KVSource for
// the pod to pull from.
type pdPickRouter struct {
	nm     string
	pol    routing.Policy
	pd     routing.PDParams
	index  bool // candidates carry the index's matched blocks
	source bool // name a kv_source
	cands  []routing.Candidate
	roles  []routing.Role
	sub    []routing.Candidate
	at     []int32
	srcs   []routing.Source
	srcPod []int
}

func (r *pdPickRouter) name() string     { return r.nm }
func (r *pdPickRouter) needsIndex() bool { return r.index }

func (r *pdPickRouter) route(q *Request, s *pdState) pdRoute {
	n := len(s.Roles)
	if len(r.cands) != n {
		r.cands, r.roles = make([]routing.Candidate, n), make([]routing.Role, n)
		r.sub, r.at = make([]routing.Candidate, n), make([]int32, n)
	}
	for p := range s.Roles {
		r.cands[p] = s.candidate(p, r.index)
		r.roles[p] = routing.RoleBoth
		switch s.Roles[p] {
		case rolePrefill:
			r.roles[p] = routing.RolePrefill
		case roleDecode:
			r.roles[p] = routing.RoleDecode
		}
	}
	req := pdRequest(q, s.Block)
	ch, err := routing.PickPD(r.pol, r.pd, req, r.cands, r.roles, r.sub, r.at)
	if err != nil {
		// Every fleet built here has a decode pod; a failure is a bug the
		// caller reports as an invalid decode pod.
		return pdRoute{Decode: -1, Prefill: -1, Source: -1}
	}
	rt := pdRoute{Decode: ch.Decode, Prefill: ch.Prefill, Source: -1}
	if !r.source {
		return rt
	}
	have := s.Matched[rt.Decode]
	if rt.Prefill >= 0 {
		have = max(have, s.Matched[rt.Prefill])
	}
	r.srcs, r.srcPod = r.srcs[:0], r.srcPod[:0]
	for p := range s.Roles {
		if p != rt.Decode && p != rt.Prefill {
			r.srcs = append(r.srcs, routing.Source{Matched: s.Matched[p], Cached: float64(s.Matched[p])})
			r.srcPod = append(r.srcPod, p)
		}
	}
	if k := routing.KVSource(have, r.srcs); k >= 0 {
		rt.Source = r.srcPod[k]
	}
	return rt
}

// pdRequest is the routing package's view of a trace request.
func pdRequest(q *Request, blockSize int) routing.Request {
	return routing.Request{Blocks: len(q.HashIDs), Tokens: q.InputLength, BlockSize: blockSize}
}
