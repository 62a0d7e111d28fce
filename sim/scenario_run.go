package sim

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// preciseIndex is the precise scorers' view of the fleet: the daemon's own
// indexer (through PreciseRouter), fed by the simulated pods' KV events.
type preciseIndex struct {
	router  *preciseRouter
	matched []int
}

func newPreciseIndex(pods, blockSize int) (*preciseIndex, error) {
	r, err := newPreciseRouter(pods, blockSize, loadGuard{-1}, 0, false, 0)
	if err != nil {
		return nil, err
	}
	return &preciseIndex{router: r, matched: make([]int, pods)}, nil
}

func (pi *preciseIndex) apply(pod int, ops []kvOp, now float64) { pi.router.onKVEvents(pod, ops, now) }

// match writes each pod's leading matched blocks of hashes into eps, which
// is indexed by fleet pod.
func (pi *preciseIndex) match(hashes []uint64, eps []endpoint) {
	pi.router.match(hashes, pi.matched)
	for p := range eps {
		eps[p].MatchedBlocks = 0
		if p < len(pi.matched) {
			eps[p].MatchedBlocks = pi.matched[p]
		}
	}
}

// stageResult is one load stage's (or the summary's) outcome. Throughput is
// what the fleet delivered while the stage's load was offered: tokens
// generated (requests completed) inside the stage's time window over its
// duration. Latencies and hit rate are over the requests that arrived in the
// stage, wherever they completed.
type stageResult struct {
	Stage            int     `json:"stage"`
	Rate             float64 `json:"rate"`
	Requests         int     `json:"requests"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	TTFTp50          float64 `json:"ttft_p50_s"`
	TTFTp90          float64 `json:"ttft_p90_s"`
	TTFTMean         float64 `json:"ttft_mean_s"`
	ITLMean          float64 `json:"itl_mean_s"`
	HitRate          float64 `json:"hit_rate"`
	Preemptions      int     `json:"preemptions"`
	// MaxKVUsage and MaxWaiting are the most referenced KV (share of a
	// pod's blocks) and the longest waiting queue of any pod while the
	// stage was being sent or drained (the published per-pod EPP charts).
	MaxKVUsage float64 `json:"max_kv_usage"`
	MaxWaiting int     `json:"max_waiting"`
	// SuccessRate is the share of requests that finished before the client's
	// timeout; latencies and tokens are over those.
	SuccessRate float64 `json:"success_rate"`
}

// schedulerResult is one scheduler's run: the summary over the measured
// stages (throughputs: mean of the stages', as the published summaries;
// latencies and hit rate: over all measured requests) and every stage.
type schedulerResult struct {
	Scheduler string `json:"scheduler"`
	stageResult
	Stages         []stageResult `json:"stages"`
	PerPodRequests []int         `json:"requests_per_pod"`
	// PodsPerGroup is the mean number of pods a shared-prefix group's
	// measured requests went to (1: every group pinned to one pod).
	PodsPerGroup float64 `json:"pods_per_group"`
	// MaxKVUsage is the peak over the whole run, warm-up included (the
	// summary's per-stage peak it shadows would leave the warm-up out).
	MaxKVUsage      float64 `json:"max_kv_usage"`
	RecomputeTokens int64   `json:"recompute_tokens"`
	Makespan        float64 `json:"makespan_s"`
	WallSeconds     float64 `json:"wall_seconds"`
}

// requestRecord is one request's life in the simulation.
type requestRecord struct {
	pod         int
	send        float64 // the client sent it (TTFT counts from here)
	firstToken  float64
	finish      float64 // finished, or failed at the timeout
	generated   int
	hitTokens   int
	preemptions int
	sent        bool
	delivered   bool // reached the endpoint picker and a pod
	done        bool // finished with all its tokens
	failed      bool // timed out (and aborted on its pod), or rejected
	rejected    bool // refused by the gateway's admission limit
}

func (rec *requestRecord) ended() bool { return rec.done || rec.failed }

type scEvKind uint8

const (
	scStepDone scEvKind = iota
	scKVDelivery
	scDeliver // a sent request reaches the endpoint picker (after the overhead)
	scTimeout // a request's client timeout
)

type scEvent struct {
	t    float64
	seq  uint64
	kind scEvKind
	pod  int
	req  int
	ops  []kvOp
}

type scHeap []scEvent

func (h scHeap) Len() int { return len(h) }
func (h scHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h scHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *scHeap) Push(x any)   { *h = append(*h, x.(scEvent)) }
func (h *scHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// scenarioRun is the simulation of one scheduler on a scenario's workload.
// It is single threaded and deterministic for a given scenario (seed).
type scenarioRun struct {
	scenario *Scenario
	workload *workload
	spec     schedulerSpec
	engines  []*engine
	sched    scheduler
	index    *preciseIndex
	events   scHeap
	seq      uint64
	records  []requestRecord
	hashes   map[int][]uint64 // prompt ID -> engine block hashes
	eps      []endpoint
	inFlight []int
	scraped  []endpoint
	nextScr  float64
	progress []seqProgress
	err      error
	// Tokens generated and requests completed inside each stage's window.
	stageTokens, stageDone []float64
	// Client: the next request to schedule, each stage's start (NaN until
	// the client reaches it), requests of each stage not yet ended, requests
	// sent and not ended, and requests waiting for a concurrency slot.
	next        int
	stageBase   []float64
	stageLeft   []int
	outstanding int
	gwActive    int // sent, admitted by the gateway and not ended
	clientQ     []int
	maxOut      int // most requests outstanding at once (tests check the bound)
	// Per stage (the stage of the last request sent): the most referenced
	// KV blocks and the longest waiting queue of any pod at a step start.
	stageMaxUsed, stageMaxWaiting []int
	// OnStep, when set, is called after every engine step (tests check
	// invariants there).
	OnStep func(pod int, e *engine)
}

// newScenarioRun prepares a run of the scheduler spec (resolved) on wl.
func newScenarioRun(sc *Scenario, wl *workload, spec schedulerSpec) (*scenarioRun, error) {
	spec, err := spec.resolve()
	if err != nil {
		return nil, err
	}
	r := &scenarioRun{scenario: sc, workload: wl, spec: spec, records: make([]requestRecord, len(wl.Requests)),
		hashes: make(map[int][]uint64), eps: make([]endpoint, sc.Pods), inFlight: make([]int, sc.Pods),
		scraped: make([]endpoint, sc.Pods), stageTokens: make([]float64, len(sc.Load.Stages)),
		stageDone: make([]float64, len(sc.Load.Stages)), stageBase: make([]float64, len(sc.Load.Stages)),
		stageLeft: make([]int, len(sc.Load.Stages)), stageMaxUsed: make([]int, len(sc.Load.Stages)),
		stageMaxWaiting: make([]int, len(sc.Load.Stages))}
	for _, q := range wl.Requests {
		r.stageLeft[q.Stage]++
	}
	for i := range r.stageBase {
		r.stageBase[i] = math.NaN()
		if !sc.Client.drains() {
			r.stageBase[i] = wl.StageStart[i]
		}
	}
	if sc.Client.drains() {
		r.openStage(0, 0)
	}
	for p := 0; p < sc.Pods; p++ {
		e, err := newEngine(sc.engineConfig())
		if err != nil {
			return nil, err
		}
		r.engines = append(r.engines, e)
		r.scraped[p].Pod = p
	}
	if r.sched, err = newReplicatedScheduler(spec, sc.Pods, sc.BlockSize, sc.KVTokensPerPod/sc.BlockSize, sc.RouterReplicas,
		sc.Seed); err != nil {
		return nil, err
	}
	if r.sched.needsIndex() {
		if r.index, err = newPreciseIndex(sc.Pods, sc.BlockSize); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *scenarioRun) push(e scEvent) {
	r.seq++
	e.seq = r.seq
	heap.Push(&r.events, e)
}

func (r *scenarioRun) engineHashes(p *prompt) []uint64 {
	h, ok := r.hashes[p.ID]
	if !ok {
		h = p.hashes(r.scenario.BlockSize, 0)
		r.hashes[p.ID] = h
	}
	return h
}

// run simulates until every request has ended (finished or timed out).
func (r *scenarioRun) run() (*schedulerResult, error) {
	start := time.Now()
	now := 0.0
	for {
		tA := r.nextScheduled()
		if r.events.Len() == 0 && math.IsInf(tA, 1) {
			break
		}
		// Engine, index and client events at the same instant as a
		// scheduled send go first: the send sees their effect.
		if r.events.Len() > 0 && r.events[0].t <= tA {
			ev := heap.Pop(&r.events).(scEvent)
			now = ev.t
			if err := r.handle(ev, now); err != nil {
				return nil, err
			}
			continue
		}
		now = tA
		r.schedule(r.next, now)
		r.next++
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.next != len(r.workload.Requests) {
		return nil, fmt.Errorf("scenario: %d of %d requests were never sent (simulator bug)", r.next, len(r.workload.Requests))
	}
	for i := range r.records {
		if !r.records[i].ended() {
			return nil, fmt.Errorf("scenario: request %d never ended (simulator bug)", i)
		}
	}
	res := r.summarise(now)
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

func (r *scenarioRun) handle(ev scEvent, now float64) error {
	switch ev.kind {
	case scStepDone:
		r.stepDone(ev.pod, now)
	case scKVDelivery:
		if r.index != nil {
			r.index.apply(ev.pod, ev.ops, now)
		}
		if r.sched.wantsEvents() {
			r.sched.onKVEvents(ev.pod, ev.ops, now)
		}
	case scDeliver:
		if !r.records[ev.req].ended() {
			return r.arrive(ev.req, now)
		}
	case scTimeout:
		rec := &r.records[ev.req]
		if rec.ended() {
			return nil
		}
		rec.failed = true
		if rec.delivered {
			if !r.engines[rec.pod].abort(ev.req) && r.err == nil {
				r.err = fmt.Errorf("scenario: timed-out request %d was not on its pod (simulator bug)", ev.req)
			}
			r.inFlight[rec.pod]--
			r.startStep(rec.pod, now) // freed blocks may admit waiting requests
		}
		r.ended(ev.req, now)
	}
	return nil
}

// nextScheduled is when the client means to send the next request: +Inf
// when there is none, or its stage has not started (inference-perf: the
// previous stage has not drained).
func (r *scenarioRun) nextScheduled() float64 {
	if r.next >= len(r.workload.Requests) {
		return math.Inf(1)
	}
	q := &r.workload.Requests[r.next]
	b := r.stageBase[q.Stage]
	if math.IsNaN(b) {
		return math.Inf(1)
	}
	return b + q.Arrival - r.workload.StageStart[q.Stage]
}

// openStage starts stage s at base, and any following empty stage with it.
func (r *scenarioRun) openStage(s int, base float64) {
	for ; s < len(r.stageBase); s++ {
		r.stageBase[s] = base
		if r.stageLeft[s] > 0 {
			return
		}
	}
}

// schedule is request i's scheduled send: sent now, or queued in the
// client while every concurrency slot is taken.
func (r *scenarioRun) schedule(i int, now float64) {
	if c := r.scenario.Client.MaxConcurrency; c > 0 && r.outstanding >= c {
		r.clientQ = append(r.clientQ, i)
		return
	}
	r.send(i, now)
}

func (r *scenarioRun) send(i int, now float64) {
	rec := &r.records[i]
	rec.sent, rec.send = true, now
	r.outstanding++
	r.maxOut = max(r.maxOut, r.outstanding)
	if g := r.scenario.Client.GatewayMaxActive; g > 0 {
		if r.gwActive >= g {
			rec.failed, rec.rejected = true, true
			r.ended(i, now)
			return
		}
		r.gwActive++
	}
	if t := r.scenario.Client.Timeout; t > 0 {
		r.push(scEvent{t: now + t, kind: scTimeout, req: i})
	}
	if o := r.overhead(i); o > 0 {
		r.push(scEvent{t: now + o, kind: scDeliver, req: i})
		return
	}
	if err := r.arrive(i, now); err != nil && r.err == nil {
		r.err = err
	}
}

// overhead is request i's time from send to the endpoint picker: the fixed
// part plus, when configured, an exponential part drawn from the request's
// index and the scenario seed, so every scheduler sees the same draws.
func (r *scenarioRun) overhead(i int) float64 {
	c := r.scenario.Client
	o := c.RequestOverhead
	if c.RequestOverheadExp > 0 {
		u := float64(mix64(r.scenario.Seed^mix64(uint64(i)+0x0ead))>>11) / (1 << 53) // [0, 1)
		o += -math.Log1p(-u) * c.RequestOverheadExp
	}
	return o
}

// ended is the client seeing request i end (response or timeout): a slot
// frees up, and with inference-perf's client the last request of a stage
// starts the next one.
func (r *scenarioRun) ended(i int, now float64) {
	r.records[i].finish = now
	r.outstanding--
	if r.scenario.Client.GatewayMaxActive > 0 && !r.records[i].rejected {
		r.gwActive--
	}
	if len(r.clientQ) > 0 {
		j := r.clientQ[0]
		r.clientQ = r.clientQ[1:]
		r.send(j, now)
	}
	s := r.workload.Requests[i].Stage
	r.stageLeft[s]--
	if r.scenario.Client.drains() && r.stageLeft[s] == 0 && s+1 < len(r.stageBase) {
		r.openStage(s+1, now+r.scenario.Client.StageGap)
	}
}

// scrape refreshes the schedulers' metric view at most every MetricsPeriod.
func (r *scenarioRun) scrape(now float64) {
	if r.scenario.MetricsPeriod > 0 && now < r.nextScr {
		return
	}
	for p, e := range r.engines {
		r.scraped[p].Waiting, r.scraped[p].Running, r.scraped[p].KVUsage = e.numWaiting(), e.numRunning(), e.kvUsage()
	}
	if r.scenario.MetricsPeriod > 0 {
		r.nextScr = (float64(int64(now/r.scenario.MetricsPeriod)) + 1) * r.scenario.MetricsPeriod
	}
}

func (r *scenarioRun) arrive(i int, now float64) error {
	q := &r.workload.Requests[i]
	hs := r.engineHashes(q.Prompt)
	r.scrape(now)
	copy(r.eps, r.scraped)
	for p := range r.eps {
		r.eps[p].InFlight = r.inFlight[p]
	}
	if r.index != nil {
		r.index.match(hs, r.eps)
	}
	pr := pickRequest{Now: now, Prompt: q.Prompt, PromptTokens: q.Prompt.Len, OutputTokens: q.OutputLen, TotalBlocks: len(hs), Hashes: hs}
	k := r.sched.pick(&pr, r.eps)
	if k < 0 || k >= len(r.eps) {
		return fmt.Errorf("scenario: scheduler %s picked endpoint %d of %d", r.spec.Name, k, len(r.eps))
	}
	pod := r.eps[k].Pod
	r.sched.routed(&pr, pod)
	r.inFlight[pod]++
	r.records[i].pod = pod
	r.records[i].delivered = true
	if err := r.engines[pod].add(i, q.Prompt.Len, q.OutputLen, hs, uint64(i)); err != nil {
		return err
	}
	r.startStep(pod, now)
	return nil
}

func (r *scenarioRun) startStep(pod int, now float64) {
	e := r.engines[pod]
	if dur, ok := e.startStep(); ok {
		r.push(scEvent{t: now + dur, kind: scStepDone, pod: pod})
		s := 0
		if r.next > 0 {
			s = r.workload.Requests[r.next-1].Stage
		}
		r.stageMaxUsed[s] = max(r.stageMaxUsed[s], e.usedBlocks())
		r.stageMaxWaiting[s] = max(r.stageMaxWaiting[s], e.numWaiting())
	}
}

func (r *scenarioRun) stepDone(pod int, now float64) {
	e := r.engines[pod]
	r.progress = e.finishStep(r.progress[:0])
	win := r.stageAt(now)
	for _, p := range r.progress {
		if win >= 0 {
			r.stageTokens[win]++
			if p.Finished {
				r.stageDone[win]++
			}
		}
		rec := &r.records[p.Req]
		rec.generated = p.Generated
		if p.FirstToken {
			rec.firstToken = now
		}
		if p.Finished {
			if rec.done && r.err == nil {
				r.err = fmt.Errorf("scenario: request %d finished twice (simulator bug)", p.Req)
			}
			rec.done = true
			rec.hitTokens = p.HitTokens
			rec.preemptions = p.Preemptions
			r.inFlight[pod]--
			r.ended(p.Req, now)
		}
	}
	if ops := e.takeKVEvents(); len(ops) > 0 && (r.index != nil || r.sched.wantsEvents()) {
		r.push(scEvent{t: now + r.scenario.KVEventLag, kind: scKVDelivery, pod: pod, ops: ops})
	}
	if r.OnStep != nil {
		r.OnStep(pod, e)
	}
	r.startStep(pod, now)
}

// stageAt is the stage whose window holds t; -1 after the last stage.
func (r *scenarioRun) stageAt(t float64) int {
	st := r.workload.StageStart
	i := sort.SearchFloat64s(st, t)
	if i == len(st) || st[i] > t {
		i--
	}
	if i < 0 || t >= st[i]+r.scenario.Load.Stages[i].Duration {
		return -1
	}
	return i
}

func (r *scenarioRun) summarise(end float64) *schedulerResult {
	sc, wl := r.scenario, r.workload
	res := &schedulerResult{Scheduler: r.spec.Name, PerPodRequests: make([]int, sc.Pods), Makespan: end}
	byStage := make([][]int, len(sc.Load.Stages))
	for i, q := range wl.Requests {
		byStage[q.Stage] = append(byStage[q.Stage], i)
		if r.records[i].delivered {
			res.PerPodRequests[r.records[i].pod]++
		}
	}
	var measured []int
	for s, ids := range byStage {
		st := r.stageResult(ids)
		st.Stage, st.Rate = s, sc.Load.Stages[s].Rate
		st.MaxKVUsage = float64(r.stageMaxUsed[s]) / float64(sc.engineConfig().KVBlocks)
		st.MaxWaiting = r.stageMaxWaiting[s]
		if sc.Client.drains() {
			st.OutputTokensPerS, st.RequestsPerS = r.harnessThroughput(ids)
		} else {
			st.OutputTokensPerS = r.stageTokens[s] / sc.Load.Stages[s].Duration
			st.RequestsPerS = r.stageDone[s] / sc.Load.Stages[s].Duration
		}
		res.Stages = append(res.Stages, st)
		if s >= sc.Load.WarmupStages {
			measured = append(measured, ids...)
		}
	}
	res.stageResult = r.stageResult(measured)
	groupPods := make(map[[2]int]bool)
	groups := make(map[int]bool)
	for _, i := range measured {
		if rec := &r.records[i]; rec.delivered {
			g := wl.Requests[i].Prompt.Group
			groupPods[[2]int{g, rec.pod}], groups[g] = true, true
		}
	}
	if len(groups) > 0 {
		res.PodsPerGroup = float64(len(groupPods)) / float64(len(groups))
	}
	n := 0
	res.OutputTokensPerS, res.RequestsPerS, res.Rate = 0, 0, 0
	for _, st := range res.Stages[sc.Load.WarmupStages:] {
		res.OutputTokensPerS += st.OutputTokensPerS
		res.RequestsPerS += st.RequestsPerS
		res.Rate += st.Rate
		n++
	}
	res.OutputTokensPerS /= float64(n)
	res.RequestsPerS /= float64(n)
	res.Rate /= float64(n)
	res.Stage = -1
	for _, st := range res.Stages[sc.Load.WarmupStages:] {
		res.MaxWaiting = max(res.MaxWaiting, st.MaxWaiting)
	}
	for _, e := range r.engines {
		st := e.statsNow()
		res.RecomputeTokens += st.RecomputeToks
		res.MaxKVUsage = max(res.MaxKVUsage, float64(st.MaxUsedBlocks)/float64(sc.engineConfig().KVBlocks))
	}
	return res
}

// harnessThroughput is inference-perf's per-stage throughput (its
// summarize_requests, as the published reports read it): output tokens of
// the successful requests over the span from the stage's first send to its
// last response, and requests over the span of their sends.
func (r *scenarioRun) harnessThroughput(ids []int) (tokPerS, reqPerS float64) {
	if len(ids) == 0 {
		return 0, 0
	}
	first, lastSend, lastEnd := math.Inf(1), math.Inf(-1), math.Inf(-1)
	tokens := 0.0
	for _, i := range ids {
		rec := &r.records[i]
		first, lastSend, lastEnd = min(first, rec.send), max(lastSend, rec.send), max(lastEnd, rec.finish)
		if rec.done {
			tokens += float64(rec.generated)
		}
	}
	if lastEnd > first {
		tokPerS = tokens / (lastEnd - first)
	}
	if lastSend > first {
		reqPerS = float64(len(ids)) / (lastSend - first)
	}
	return tokPerS, reqPerS
}

func (r *scenarioRun) stageResult(ids []int) stageResult {
	var st stageResult
	st.Requests = len(ids)
	if len(ids) == 0 {
		return st
	}
	ttft := make([]float64, 0, len(ids))
	var prompt, hit, itlNum, itlDen float64
	var ttftSum float64
	ok := 0
	for _, i := range ids {
		q, rec := &r.workload.Requests[i], &r.records[i]
		if !rec.done {
			continue // timed out: no latency, as inference-perf counts only successes
		}
		ok++
		t := rec.firstToken - rec.send
		ttft = append(ttft, t)
		ttftSum += t
		prompt += float64(q.Prompt.Len)
		hit += float64(rec.hitTokens)
		if rec.generated > 1 {
			itlNum += rec.finish - rec.firstToken
			itlDen += float64(rec.generated - 1)
		}
		st.Preemptions += rec.preemptions
	}
	st.SuccessRate = float64(ok) / float64(len(ids))
	if ok == 0 {
		return st
	}
	slices.Sort(ttft)
	st.TTFTp50, st.TTFTp90 = quantile(ttft, 0.5), quantile(ttft, 0.9)
	st.TTFTMean = ttftSum / float64(ok)
	if itlDen > 0 {
		st.ITLMean = itlNum / itlDen
	}
	if prompt > 0 {
		st.HitRate = hit / prompt
	}
	return st
}

// ScenarioReport is what `simulate --scenario --out` writes.
type ScenarioReport struct {
	Scenario string     `json:"scenario"`
	Warmup   int        `json:"warmup_stages"`
	Pods     int        `json:"pods"`
	KVBlocks int        `json:"kv_blocks_per_pod"`
	Block    int        `json:"block_size"`
	Engine   engineSpec `json:"engine"`
	Requests int        `json:"requests"`
	// RouterReplicas is the number of independent pickers each scheduler
	// ran as (router_replicas).
	RouterReplicas int                `json:"router_replicas"`
	Results        []*schedulerResult `json:"results"`
}

// RunScenario runs every scheduler of sc on the same generated workload.
func RunScenario(sc *Scenario) (*ScenarioReport, error) {
	wl := sc.generateWorkload()
	rep := &ScenarioReport{Scenario: sc.Name, Pods: sc.Pods, KVBlocks: sc.KVTokensPerPod / sc.BlockSize, Block: sc.BlockSize,
		Engine: sc.Engine, Requests: len(wl.Requests), Warmup: sc.Load.WarmupStages, RouterReplicas: sc.RouterReplicas}
	for _, spec := range sc.Schedulers {
		run, err := newScenarioRun(sc, wl, spec)
		if err != nil {
			return nil, fmt.Errorf("scenario: %s: %w", spec.Name, err)
		}
		res, err := run.run()
		if err != nil {
			return nil, fmt.Errorf("scenario: %s: %w", spec.Name, err)
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

func (rep *ScenarioReport) warmup() int { return rep.Warmup }
