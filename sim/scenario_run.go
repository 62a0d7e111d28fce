package sim

import (
	"container/heap"
	"fmt"
	"slices"
	"sort"
	"time"
)

// preciseIndex is the precise scorers' view of the fleet: the daemon's own
// indexer (through PreciseRouter), fed by the simulated pods' KV events.
type preciseIndex struct {
	router  *PreciseRouter
	matched []int
}

func newPreciseIndex(pods, blockSize int) (*preciseIndex, error) {
	r, err := NewPreciseRouter(pods, blockSize, LoadGuard{-1}, 0, false, 0)
	if err != nil {
		return nil, err
	}
	return &preciseIndex{router: r, matched: make([]int, pods)}, nil
}

func (x *preciseIndex) apply(pod int, ops []KVOp, now float64) { x.router.OnKVEvents(pod, ops, now) }

// match writes each pod's leading matched blocks of hashes into eps, which
// is indexed by fleet pod.
func (x *preciseIndex) match(hashes []uint64, eps []Endpoint) {
	x.router.Match(hashes, x.matched)
	for p := range eps {
		eps[p].MatchedBlocks = 0
		if p < len(x.matched) {
			eps[p].MatchedBlocks = x.matched[p]
		}
	}
}

// StageResult is one load stage's (or the summary's) outcome. Throughput is
// what the fleet delivered while the stage's load was offered: tokens
// generated (requests completed) inside the stage's time window over its
// duration. Latencies and hit rate are over the requests that arrived in the
// stage, wherever they completed.
type StageResult struct {
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
}

// SchedulerResult is one scheduler's run: the summary over the measured
// stages (throughputs: mean of the stages', as the published summaries;
// latencies and hit rate: over all measured requests) and every stage.
type SchedulerResult struct {
	Scheduler string `json:"scheduler"`
	StageResult
	Stages          []StageResult `json:"stages"`
	PerPodRequests  []int         `json:"requests_per_pod"`
	MaxKVUsage      float64       `json:"max_kv_usage"`
	RecomputeTokens int64         `json:"recompute_tokens"`
	Makespan        float64       `json:"makespan_s"`
	WallSeconds     float64       `json:"wall_seconds"`
}

// requestRecord is one request's life in the simulation.
type requestRecord struct {
	pod         int
	firstToken  float64
	finish      float64
	generated   int
	hitTokens   int
	preemptions int
	done        bool
}

type scEvKind uint8

const (
	scStepDone scEvKind = iota
	scKVDelivery
)

type scEvent struct {
	t    float64
	seq  uint64
	kind scEvKind
	pod  int
	ops  []KVOp
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

// ScenarioRun is the simulation of one scheduler on a scenario's workload.
// It is single threaded and deterministic for a given scenario (seed).
type ScenarioRun struct {
	sc       *Scenario
	wl       *Workload
	spec     SchedulerSpec
	engines  []*Engine
	sched    scheduler
	index    *preciseIndex
	events   scHeap
	seq      uint64
	records  []requestRecord
	hashes   map[int][]uint64 // prompt ID -> engine block hashes
	eps      []Endpoint
	inFlight []int
	scraped  []Endpoint
	nextScr  float64
	progress []SeqProgress
	err      error
	// Tokens generated and requests completed inside each stage's window.
	stageTokens, stageDone []float64
	// OnStep, when set, is called after every engine step (tests check
	// invariants there).
	OnStep func(pod int, e *Engine)
}

// NewScenarioRun prepares a run of the scheduler spec (resolved) on wl.
func NewScenarioRun(sc *Scenario, wl *Workload, spec SchedulerSpec) (*ScenarioRun, error) {
	spec, err := spec.resolve()
	if err != nil {
		return nil, err
	}
	r := &ScenarioRun{sc: sc, wl: wl, spec: spec, records: make([]requestRecord, len(wl.Requests)),
		hashes: make(map[int][]uint64), eps: make([]Endpoint, sc.Pods), inFlight: make([]int, sc.Pods),
		scraped: make([]Endpoint, sc.Pods), stageTokens: make([]float64, len(sc.Load.Stages)),
		stageDone: make([]float64, len(sc.Load.Stages))}
	for p := 0; p < sc.Pods; p++ {
		e, err := NewEngine(sc.engineConfig())
		if err != nil {
			return nil, err
		}
		r.engines = append(r.engines, e)
		r.scraped[p].Pod = p
	}
	if r.sched, err = newScheduler(spec, sc.Pods, sc.BlockSize, sc.KVTokensPerPod/sc.BlockSize, sc.Seed); err != nil {
		return nil, err
	}
	if r.sched.needsIndex() {
		if r.index, err = newPreciseIndex(sc.Pods, sc.BlockSize); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *ScenarioRun) push(e scEvent) {
	r.seq++
	e.seq = r.seq
	heap.Push(&r.events, e)
}

func (r *ScenarioRun) engineHashes(p *Prompt) []uint64 {
	h, ok := r.hashes[p.ID]
	if !ok {
		h = p.Hashes(r.sc.BlockSize, 0)
		r.hashes[p.ID] = h
	}
	return h
}

// Run simulates until every request has finished.
func (r *ScenarioRun) Run() (*SchedulerResult, error) {
	start := time.Now()
	reqs := r.wl.Requests
	next := 0
	now := 0.0
	for next < len(reqs) || r.events.Len() > 0 {
		// Engine and index events at the same instant as an arrival go
		// first: the arrival sees their effect.
		if r.events.Len() > 0 && (next >= len(reqs) || r.events[0].t <= reqs[next].Arrival) {
			ev := heap.Pop(&r.events).(scEvent)
			now = ev.t
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
			}
			continue
		}
		now = reqs[next].Arrival
		if err := r.arrive(next, now); err != nil {
			return nil, err
		}
		next++
	}
	if r.err != nil {
		return nil, r.err
	}
	for i := range r.records {
		if !r.records[i].done {
			return nil, fmt.Errorf("scenario: request %d never finished (simulator bug)", i)
		}
	}
	res := r.summarise(now)
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// scrape refreshes the schedulers' metric view at most every MetricsPeriod.
func (r *ScenarioRun) scrape(now float64) {
	if r.sc.MetricsPeriod > 0 && now < r.nextScr {
		return
	}
	for p, e := range r.engines {
		r.scraped[p].Waiting, r.scraped[p].Running, r.scraped[p].KVUsage = e.Waiting(), e.Running(), e.KVUsage()
	}
	if r.sc.MetricsPeriod > 0 {
		r.nextScr = (float64(int64(now/r.sc.MetricsPeriod)) + 1) * r.sc.MetricsPeriod
	}
}

func (r *ScenarioRun) arrive(i int, now float64) error {
	q := &r.wl.Requests[i]
	hs := r.engineHashes(q.Prompt)
	r.scrape(now)
	copy(r.eps, r.scraped)
	for p := range r.eps {
		r.eps[p].InFlight = r.inFlight[p]
	}
	if r.index != nil {
		r.index.match(hs, r.eps)
	}
	pr := PickRequest{Now: now, Prompt: q.Prompt, PromptTokens: q.Prompt.Len, OutputTokens: q.OutputLen, TotalBlocks: len(hs), Hashes: hs}
	k := r.sched.pick(&pr, r.eps)
	if k < 0 || k >= len(r.eps) {
		return fmt.Errorf("scenario: scheduler %s picked endpoint %d of %d", r.spec.Name, k, len(r.eps))
	}
	pod := r.eps[k].Pod
	r.sched.routed(&pr, pod)
	r.inFlight[pod]++
	r.records[i].pod = pod
	if err := r.engines[pod].Add(i, q.Prompt.Len, q.OutputLen, hs, uint64(i)); err != nil {
		return err
	}
	r.startStep(pod, now)
	return nil
}

func (r *ScenarioRun) startStep(pod int, now float64) {
	e := r.engines[pod]
	if dur, ok := e.StartStep(); ok {
		r.push(scEvent{t: now + dur, kind: scStepDone, pod: pod})
	}
}

func (r *ScenarioRun) stepDone(pod int, now float64) {
	e := r.engines[pod]
	r.progress = e.FinishStep(r.progress[:0])
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
			rec.finish = now
			rec.hitTokens = p.HitTokens
			rec.preemptions = p.Preemptions
			r.inFlight[pod]--
		}
	}
	if ops := e.TakeKVEvents(); len(ops) > 0 && (r.index != nil || r.sched.wantsEvents()) {
		r.push(scEvent{t: now + r.sc.KVEventLag, kind: scKVDelivery, pod: pod, ops: ops})
	}
	if r.OnStep != nil {
		r.OnStep(pod, e)
	}
	r.startStep(pod, now)
}

// stageAt is the stage whose window holds t; -1 after the last stage.
func (r *ScenarioRun) stageAt(t float64) int {
	st := r.wl.StageStart
	i := sort.SearchFloat64s(st, t)
	if i == len(st) || st[i] > t {
		i--
	}
	if i < 0 || t >= st[i]+r.sc.Load.Stages[i].Duration {
		return -1
	}
	return i
}

func (r *ScenarioRun) summarise(end float64) *SchedulerResult {
	sc, wl := r.sc, r.wl
	res := &SchedulerResult{Scheduler: r.spec.Name, PerPodRequests: make([]int, sc.Pods), Makespan: end}
	byStage := make([][]int, len(sc.Load.Stages))
	for i, q := range wl.Requests {
		byStage[q.Stage] = append(byStage[q.Stage], i)
		res.PerPodRequests[r.records[i].pod]++
	}
	var measured []int
	for s, ids := range byStage {
		st := r.stageResult(ids)
		st.Stage, st.Rate = s, sc.Load.Stages[s].Rate
		st.OutputTokensPerS = r.stageTokens[s] / sc.Load.Stages[s].Duration
		st.RequestsPerS = r.stageDone[s] / sc.Load.Stages[s].Duration
		res.Stages = append(res.Stages, st)
		if s >= sc.Load.WarmupStages {
			measured = append(measured, ids...)
		}
	}
	res.StageResult = r.stageResult(measured)
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
	for _, e := range r.engines {
		st := e.Stats()
		res.RecomputeTokens += st.RecomputeToks
		res.MaxKVUsage = max(res.MaxKVUsage, float64(st.MaxUsedBlocks)/float64(sc.engineConfig().KVBlocks))
	}
	return res
}

func (r *ScenarioRun) stageResult(ids []int) StageResult {
	var st StageResult
	st.Requests = len(ids)
	if len(ids) == 0 {
		return st
	}
	ttft := make([]float64, 0, len(ids))
	var prompt, hit, itlNum, itlDen float64
	var ttftSum float64
	for _, i := range ids {
		q, rec := &r.wl.Requests[i], &r.records[i]
		t := rec.firstToken - q.Arrival
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
	slices.Sort(ttft)
	st.TTFTp50, st.TTFTp90 = quantile(ttft, 0.5), quantile(ttft, 0.9)
	st.TTFTMean = ttftSum / float64(len(ids))
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
	Scenario string             `json:"scenario"`
	Warmup   int                `json:"warmup_stages"`
	Pods     int                `json:"pods"`
	KVBlocks int                `json:"kv_blocks_per_pod"`
	Block    int                `json:"block_size"`
	Engine   EngineSpec         `json:"engine"`
	Requests int                `json:"requests"`
	Results  []*SchedulerResult `json:"results"`
}

// RunScenario runs every scheduler of sc on the same generated workload.
func RunScenario(sc *Scenario) (*ScenarioReport, error) {
	wl := sc.GenerateWorkload()
	rep := &ScenarioReport{Scenario: sc.Name, Pods: sc.Pods, KVBlocks: sc.KVTokensPerPod / sc.BlockSize, Block: sc.BlockSize,
		Engine: sc.Engine, Requests: len(wl.Requests), Warmup: sc.Load.WarmupStages}
	for _, spec := range sc.Schedulers {
		run, err := NewScenarioRun(sc, wl, spec)
		if err != nil {
			return nil, fmt.Errorf("scenario: %s: %w", spec.Name, err)
		}
		res, err := run.Run()
		if err != nil {
			return nil, fmt.Errorf("scenario: %s: %w", spec.Name, err)
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

func (rep *ScenarioReport) warmup() int { return rep.Warmup }
