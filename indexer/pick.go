package indexer

import (
	"context"

	"go.opentelemetry.io/otel/attribute"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// MaxCandidates bounds one Pick's candidates (a router's live endpoints for
// one model; far above any fleet one router balances).
const MaxCandidates = 4096

// EventsMode is whether a candidate publishes KV events.
type EventsMode uint8

const (
	// EventsAuto: the pod is matched through the index when the index
	// knows it (it published events), else through the routing history.
	EventsAuto EventsMode = iota
	// EventsOn: the pod publishes events; it is matched through the index
	// only (a pod that has published nothing yet holds nothing).
	EventsOn
	// EventsOff: the pod publishes nothing; it is matched through the
	// routing history of earlier picks (an approximate index).
	EventsOff
)

// Candidate is one pod a router may send the request to, with the load the
// router sees.
type Candidate struct {
	Pod string
	// DPRank names one data-parallel rank of the pod when HasDPRank;
	// otherwise every rank of the pod is a match and the best one is named
	// in the answer.
	DPRank    int
	HasDPRank bool
	Events    EventsMode
	routing.Load
	// Role is the pod's part in a disaggregated (P/D) fleet; the zero
	// value, routing.RoleBoth, is an aggregated pod. A query whose
	// candidates are all RoleBoth is answered exactly as before roles
	// existed; any other role makes it a P/D pick (see PickResult).
	Role routing.Role
}

// PickQuery is one pick request: the request as for Score (Query; its Pods
// filter must be empty, the candidates take its place), the router's
// candidates and optionally a policy name ("" = the configured default).
type PickQuery struct {
	Query
	Candidates []Candidate
	Policy     string
}

// CandidateResult is one candidate in a pick answer, in the order of the
// query's candidates, with the numbers that decided it.
type CandidateResult struct {
	Pod       string
	DPRank    int
	HasDPRank bool
	// MatchedBlocks is the request's leading blocks the pod is taken to
	// hold: indexed, then speculative; or from the routing history when
	// Approximate.
	MatchedBlocks int
	// SpeculativeBlocks of MatchedBlocks are held only because an earlier
	// pick chose this pod and its events have not confirmed them yet.
	SpeculativeBlocks int
	// Approximate: the pod is matched by the routing history (no events).
	Approximate bool
	// Tiers counts the indexed blocks by tier.
	Tiers TierCounts
	// Cached is MatchedBlocks weighted by tier (what the policies read).
	Cached float64
	// Score and Cost are the policy's numbers (see package routing).
	Score float64
	Cost  float64
	// Session: the query named a session and this candidate stored blocks
	// for it.
	Session bool
	// Role repeats the candidate's role.
	Role routing.Role
}

// KVSource names where the pod that prefills a P/D request can pull cached
// KV from instead of recomputing it (routing.KVSource): a pod, candidate or
// not, holding more leading blocks of the request than every chosen pod.
// Only blocks its own events confirmed count (not speculative entries, not
// the routing history). Shared storage is never named: its blocks are
// already counted in its readers' matched blocks (storage.go).
type KVSource struct {
	Pod       string
	DPRank    int
	HasDPRank bool
	// Candidate is the source's index among the query's candidates, -1
	// for a pod the router did not offer.
	Candidate int
	// Blocks is how many leading blocks of the request it holds;
	// ExtraBlocks of them are beyond the most any chosen pod holds (what
	// pulling from it saves).
	Blocks      int
	ExtraBlocks int
	// Tiers counts Blocks by the tier they are on (a CPU or disk tier is
	// slower to pull from).
	Tiers TierCounts
}

// PickResult is the answer to one PickQuery. Like Result it is owned by
// the caller and reused: Pick overwrites it and allocates nothing once its
// buffers have grown. Candidates is valid until the next Pick or Reset.
type PickResult struct {
	// Chosen is the index of the picked candidate; Pod and DPRank repeat
	// its name (DPRank when the query named it or the index matched a rank).
	Chosen    int
	Pod       string
	DPRank    int
	HasDPRank bool
	Policy    string
	Reason    routing.Reason
	// PickID names this decision for Feedback (never 0): a router hands it
	// back with the engine's reported cached tokens.
	PickID uint64
	// TotalBlocks and BlockSize are as in Result.
	TotalBlocks int
	BlockSize   int
	Candidates  []CandidateResult

	// P/D: set when some candidate has a role other than both. Pod is
	// then the decode pod; Split is the disaggregation decision, from
	// NonCachedTokens (the prompt tokens Pod would compute itself) and
	// PrefillWaiting (the prefill candidates' queue); Prefill is the
	// prefill pod's candidate index when Split is routing.SplitRemote,
	// else -1, and PrefillPod, PrefillDPRank and PrefillReason name it.
	PD               bool
	PDParams         routing.PDParams // the thresholds Split read
	Split            routing.Split
	NonCachedTokens  int
	PrefillWaiting   int
	Prefill          int
	PrefillPod       string
	PrefillDPRank    int
	PrefillHasDPRank bool
	PrefillReason    routing.Reason
	// KVSource is set (HasKVSource) in a P/D pick when a pod holds more
	// leading blocks than the chosen ones.
	KVSource    KVSource
	HasKVSource bool

	keys    []blockkeys.Key
	ek      engineKeys
	ids     []kvindex.PodID
	sess    []kvindex.PodID // the query session's pods
	owner   []int32         // PodID -> candidate index + 1
	res     kvindex.ScoreResult
	rc      []routing.Candidate
	mode    []EventsMode // resolved: EventsOn or EventsOff
	holders []uint64
	// eng: the engine each candidate's blocks are indexed under (the
	// primary keys' engine, vLLM, when unknown); see keysOf.
	eng []blockkeys.Engine
	run []int32
	// the candidates whose runs speculative entries may extend, their
	// holders and where their indexed runs end
	specAt      []int32
	specHolders []uint64
	start       []int32
	ext         []int32
	table       holderTable
	// P/D scratch: roles, PickPD's buffers, the best holder that is no
	// candidate (srcPod < 0: none) and the kv_source candidates
	roles    []routing.Role
	sub      []routing.Candidate
	at       []int32
	src      []routing.Source
	srcAt    []int32
	srcPod   kvindex.PodID
	srcOK    bool
	srcScore kvindex.PodScore
	// now is the pick's time (speculative and history entries).
	now int64
}

// Reset empties r and drops oversized buffers; call it before pooling r.
func (r *PickResult) Reset() {
	if cap(r.keys) > maxKeptKeys {
		r.keys = nil
	}
	r.clear()
}

func (r *PickResult) clear() {
	r.Chosen, r.Pod, r.DPRank, r.HasDPRank, r.Policy, r.Reason, r.PickID = 0, "", 0, false, "", 0, 0
	r.TotalBlocks, r.BlockSize = 0, 0
	r.PD, r.PDParams, r.Split, r.NonCachedTokens, r.PrefillWaiting = false, routing.PDParams{}, 0, 0, 0
	r.Prefill, r.PrefillPod, r.PrefillDPRank, r.PrefillHasDPRank, r.PrefillReason = -1, "", 0, false, 0
	r.KVSource, r.HasKVSource, r.srcOK = KVSource{}, false, false
	clear(r.Candidates)
	r.Candidates = r.Candidates[:0]
	r.keys = r.keys[:0]
	r.ek.clear()
}

func (q *PickQuery) validate() *Error {
	if err := q.Query.validate(); err != nil {
		return err
	}
	if len(q.Pods) > 0 {
		return errorf(InvalidArgument, "pods does not apply to pick: the candidates are the pods")
	}
	if len(q.Candidates) == 0 {
		return errorf(InvalidArgument, "candidates is required: the router's live endpoints with their load")
	}
	if len(q.Candidates) > MaxCandidates {
		return errorf(InvalidArgument, "candidates has %d entries, limit %d", len(q.Candidates), MaxCandidates)
	}
	for i := range q.Candidates {
		c := &q.Candidates[i]
		switch {
		case c.Pod == "":
			return errorf(InvalidArgument, "candidates[%d].pod is empty", i)
		case c.HasDPRank && c.DPRank < 0:
			return errorf(InvalidArgument, "candidates[%d].dp_rank is %d, must be >= 0", i, c.DPRank)
		case c.Waiting < 0 || c.Running < 0:
			return errorf(InvalidArgument, "candidates[%d]: waiting and running must be >= 0", i)
		case !(c.KVUsage >= 0 && c.KVUsage <= 1):
			return errorf(InvalidArgument, "candidates[%d].kv_usage is %v, must be in [0, 1]", i, c.KVUsage)
		case c.Events > EventsOff:
			return errorf(InvalidArgument, "candidates[%d]: unknown events mode %d", i, c.Events)
		case c.Role >= routing.NumRoles:
			return errorf(InvalidArgument, "candidates[%d]: unknown role %d", i, c.Role)
		}
	}
	return nil
}

// Pick chooses one of q's candidates for the request: the request's block
// keys are computed exactly as Score does, every candidate is matched
// (through the index plus speculative entries, or through the routing
// history for pods without events), and the policy decides with the
// candidates' load. The chosen pod is then assumed to hold the request's
// blocks: speculatively (until its events confirm them or the TTL passes)
// or in the routing history. A non-nil error is an *Error and r is empty.
func (ix *Indexer) Pick(ctx context.Context, q *PickQuery, r *PickResult) error {
	r.clear()
	if err := ix.pickInto(ctx, q, r); err != nil {
		r.clear()
		return err
	}
	return nil
}

func (ix *Indexer) pickInto(ctx context.Context, q *PickQuery, r *PickResult) *Error {
	if err := q.validate(); err != nil {
		return err
	}
	r.PD = pdQuery(q)
	if r.PD {
		r.PDParams = ix.pick.pd
	}
	pol := ix.pick.def
	if q.Policy != "" {
		var ok bool
		if pol, ok = ix.pick.index(q.Policy); !ok {
			return errorf(InvalidArgument, "unknown policy %q (want one of %v)", q.Policy, routing.Names())
		}
	}
	clk := ix.clock(OpPick)
	in, err := ix.requestKeys(ctx, &q.Query, &r.keys, &r.ek, &clk)
	if err != nil {
		return err
	}
	r.BlockSize, r.TotalBlocks = in.blockSize, len(r.keys)
	n := len(q.Candidates)
	r.prepare(n)
	lctx, span := ix.tr.StartChild(ctx, tracing.SpanLookup)
	err = ix.pickMatch(lctx, &in, q, r)
	if span.IsRecording() {
		matched, best := 0, 0
		for i := range r.Candidates {
			if m := r.Candidates[i].MatchedBlocks; m > 0 {
				matched++
				best = max(best, m)
			}
		}
		span.SetAttributes(tracing.Blocks.Int(len(r.keys)), tracing.PickCandidates.Int(n),
			tracing.PodsMatched.Int(matched), tracing.BestBlocks.Int(best))
	}
	endStage(span, err)
	if err != nil {
		return err
	}
	clk.lap(StageLookup)

	pctx, span := ix.tr.StartChild(ctx, tracing.SpanPick)
	err = ix.decide(pctx, pol, in, q, r)
	if err == nil && span.IsRecording() {
		span.SetAttributes(pickAttrs(r)...)
	}
	endStage(span, err)
	if err != nil {
		return err
	}
	clk.lap(StagePolicy)
	return nil
}

// pickMatch matches every candidate: index, speculative entries, routing
// history.
func (ix *Indexer) pickMatch(ctx context.Context, in *requestInfo, q *PickQuery, r *PickResult) *Error {
	if err := ix.resolveCandidates(q, r); err != nil {
		return err
	}
	if err := ix.resolveShared(ctx, in, q, r); err != nil {
		r.releaseOwners()
		return err
	}
	if err := ix.matchIndexed(ctx, *in, q, r); err != nil {
		return err
	}
	r.now = ix.pick.now().UnixNano()
	ix.matchSpeculative(ctx, q.Model, r)
	ix.matchHistory(q.Model, r, r.now)
	return nil
}

// decide runs policy pol over the matched candidates (P/D: the pair) and
// records the pick.
func (ix *Indexer) decide(ctx context.Context, pol int, in requestInfo, q *PickQuery, r *PickResult) *Error {
	gpu := ix.scorer.Weights()[event.TierGPU]
	for i := range r.Candidates {
		c := &r.Candidates[i]
		c.Cached += float64(c.MatchedBlocks-int(c.Tiers.sum())) * gpu
		r.rc[i] = routing.Candidate{Load: q.Candidates[i].Load, Matched: routeMatched(c.MatchedBlocks, c.Tiers[event.TierShared]), Cached: c.Cached}
	}
	tokens := in.tokens
	if tokens == 0 {
		tokens = r.TotalBlocks * r.BlockSize
	}
	p := ix.pick.order[pol]
	req := routing.Request{Blocks: r.TotalBlocks, Tokens: tokens, BlockSize: r.BlockSize}
	var chosen int
	var why routing.Reason
	if r.PD {
		ch, err := ix.pickPD(p, req, q, r)
		if err != nil {
			return err
		}
		chosen, why = ch.Decode, ch.DecodeReason
	} else {
		chosen, why = p.Pick(req, r.rc)
	}
	for i := range r.Candidates {
		r.Candidates[i].Score, r.Candidates[i].Cost = r.rc[i].Score, r.rc[i].Cost
	}
	policyChosen := chosen
	if q.SessionID != "" {
		chosen = ix.pickSession(q, r, chosen)
	}
	c := &r.Candidates[chosen]
	r.Chosen, r.Pod, r.DPRank, r.HasDPRank = chosen, c.Pod, c.DPRank, c.HasDPRank
	r.Policy, r.Reason = p.Name(), why
	ix.m.picks[pol][why].Inc()
	r.PickID = ix.quality.observe(in.model, in.modelKnown, r, policyChosen, in.tokens)
	if r.PD {
		ix.finishPD(q, r, gpu)
	}
	// The blocks go where they will be held afterwards: the pod that
	// prefills computes and caches them, and a decode pod that received
	// them from a prefill pod caches them too (docs/api.md, "P/D").
	ix.record(ctx, q.Model, r, chosen, r.now)
	if r.Prefill >= 0 {
		ix.record(ctx, q.Model, r, r.Prefill, r.now)
	}
	return nil
}

// pickAttrs are the pick span's attributes: the decision and what decided
// it. Only names and counts.
func pickAttrs(r *PickResult) []attribute.KeyValue {
	a := []attribute.KeyValue{
		tracing.PickPolicy.String(r.Policy), tracing.PickReason.String(r.Reason.String()),
		tracing.PickPod.String(r.Pod), tracing.PickCandidates.Int(len(r.Candidates)),
		tracing.PickMatched.Int(r.Candidates[r.Chosen].MatchedBlocks),
	}
	if r.HasDPRank {
		a = append(a, tracing.PickDPRank.Int(r.DPRank))
	}
	if r.PD {
		a = append(a, tracing.PickSplit.String(r.Split.String()))
		if r.Prefill >= 0 {
			a = append(a, tracing.PickPrefillPod.String(r.PrefillPod))
		}
		if r.HasKVSource {
			a = append(a, tracing.PickKVSource.String(r.KVSource.Pod))
		}
	}
	return a
}

func (p *picker) index(name string) (int, bool) {
	for i, pol := range p.order {
		if pol.Name() == name {
			return i, true
		}
	}
	return 0, false
}

// prepare sizes the per-candidate buffers for n candidates.
func (r *PickResult) prepare(n int) {
	r.Candidates = grow(r.Candidates, n)
	r.rc = grow(r.rc, n)
	r.mode = grow(r.mode, n)
	r.holders = grow(r.holders, n)
	r.eng = grow(r.eng, n)
	r.run = grow(r.run, n)
	r.ids = r.ids[:0]
	r.table.reset(n)
}

// grow returns s with length n, its elements zeroed.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		s = make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// resolveCandidates names every candidate, decides how it is matched and
// rejects duplicates.
func (ix *Indexer) resolveCandidates(q *PickQuery, r *PickResult) *Error {
	for i := range q.Candidates {
		qc := &q.Candidates[i]
		rank := -1
		if qc.HasDPRank {
			rank = qc.DPRank
		}
		r.Candidates[i] = CandidateResult{Pod: qc.Pod, DPRank: qc.DPRank, HasDPRank: qc.HasDPRank, Role: qc.Role}
		h := holderID(qc.Pod, rank)
		if !r.table.put(h, int32(i)) {
			r.releaseOwners()
			return errorf(InvalidArgument, "candidates[%d] repeats pod %q%s", i, qc.Pod, rankSuffix(qc))
		}
		r.holders[i] = h
		r.run[i] = -1 // not matched by the routing history
		r.eng[i] = blockkeys.EngineVLLM
		before := len(r.ids)
		if qc.Events != EventsOff {
			if qc.HasDPRank {
				if id, ok := ix.in.LookupPod(qc.Pod, qc.DPRank); ok {
					r.ids = append(r.ids, id)
				}
			} else {
				r.ids = ix.in.AppendPodsNamed(r.ids, qc.Pod)
			}
		}
		if qc.Events == EventsOff || (qc.Events == EventsAuto && len(r.ids) == before) {
			r.mode[i] = EventsOff
			r.Candidates[i].Approximate = true
			r.run[i] = 0
			continue
		}
		r.mode[i] = EventsOn
		r.eng[i] = ix.podEngine(r.ids[before:])
		if err := r.own(q, i, before); err != nil {
			return err
		}
	}
	return nil
}

// own makes candidate i the owner of r.ids[before:], its engines.
func (r *PickResult) own(q *PickQuery, i, before int) *Error {
	for _, id := range r.ids[before:] {
		if int(id) >= len(r.owner) {
			r.owner = append(r.owner, make([]int32, int(id)+1-len(r.owner))...)
		}
		if r.owner[id] != 0 {
			// (pod) and (pod, rank) both listed: one engine twice
			r.releaseOwners()
			qc := &q.Candidates[i]
			return errorf(InvalidArgument, "candidates[%d] repeats pod %q%s", i, qc.Pod, rankSuffix(qc))
		}
		r.owner[id] = int32(i) + 1
	}
	return nil
}

// resolveShared finds, in a shared index (Backend.Names), the candidates
// this process never met: another daemon sharing the index may have
// applied their events. As Score does, it reads every holder of the
// request's blocks once (the backend interns the pods it reads), then names
// the candidates again; those found are matched through the index like any
// pod with events. It costs one more lookup, only when a candidate that may
// have events is unknown here.
func (ix *Indexer) resolveShared(ctx context.Context, in *requestInfo, q *PickQuery, r *PickResult) *Error {
	if ix.backend.Names == nil || len(r.keys) == 0 {
		return nil
	}
	unknown := false
	for i := range q.Candidates {
		unknown = unknown || (q.Candidates[i].Events != EventsOff && r.run[i] == 0) ||
			(q.Candidates[i].Events == EventsOn && !r.owns(i))
	}
	if !unknown {
		return nil
	}
	if !in.modelKnown {
		var err *Error
		if in.model, in.modelKnown, err = ix.sharedModel(ctx, q.Model, r.keys[0]); err != nil || !in.modelKnown {
			return err
		}
	}
	if err := ix.lookupAll(ctx, in.model, r.keys, &r.ek, nil, &r.res); err != nil {
		return err
	}
	for i := range q.Candidates {
		qc := &q.Candidates[i]
		if qc.Events == EventsOff || r.owns(i) {
			continue
		}
		before := len(r.ids)
		if qc.HasDPRank {
			if id, ok := ix.in.LookupPod(qc.Pod, qc.DPRank); ok {
				r.ids = append(r.ids, id)
			}
		} else {
			r.ids = ix.in.AppendPodsNamed(r.ids, qc.Pod)
		}
		if len(r.ids) == before {
			continue
		}
		r.mode[i], r.run[i] = EventsOn, -1
		r.Candidates[i].Approximate = false
		if err := r.own(q, i, before); err != nil {
			return err
		}
	}
	return nil
}

// owns reports whether candidate i owns an engine of r.ids.
func (r *PickResult) owns(i int) bool {
	for _, id := range r.ids {
		if int(id) < len(r.owner) && r.owner[id] == int32(i)+1 {
			return true
		}
	}
	return false
}

func rankSuffix(c *Candidate) string {
	if c.HasDPRank {
		return " dp_rank " + itoa(c.DPRank)
	}
	return ""
}

func itoa(v int) string {
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

func (r *PickResult) releaseOwners() {
	for _, id := range r.ids {
		if int(id) < len(r.owner) {
			r.owner[id] = 0
		}
	}
}

// matchIndexed scores the index-matched candidates' engines in one lookup
// and keeps each candidate's best rank.
func (ix *Indexer) matchIndexed(ctx context.Context, in requestInfo, q *PickQuery, r *PickResult) *Error {
	defer r.releaseOwners()
	if !in.modelKnown || len(r.keys) == 0 || (len(r.ids) == 0 && !r.PD) {
		if len(r.ids) > 0 || hasMode(r.mode, EventsOn) {
			// as Score: an index that is down is reported, not read as empty
			if err := ix.Healthy(ctx); err != nil {
				return errorf(Unavailable, "index unavailable: %v", err)
			}
		}
		return nil
	}
	ids := r.ids
	if r.PD {
		// every holder: the best one that is no candidate may be the
		// kv_source
		ids = nil
	}
	if err := ix.lookupAll(ctx, in.model, r.keys, &r.ek, ids, &r.res); err != nil {
		return err
	}
	for _, ps := range r.res.Pods {
		if !ix.trusted(ps.Pod) {
			continue
		}
		if int(ps.Pod) >= len(r.owner) || r.owner[ps.Pod] == 0 {
			if r.PD {
				r.offerSource(ps)
			}
			continue
		}
		i := r.owner[ps.Pod] - 1
		c := &r.Candidates[i]
		_, rank := ix.in.PodName(ps.Pod)
		better := ps.Score > c.Cached || (ps.Score == c.Cached && ps.MatchedBlocks > c.MatchedBlocks) ||
			(ps.Score == c.Cached && ps.MatchedBlocks == c.MatchedBlocks && !q.Candidates[i].HasDPRank && rank < c.DPRank)
		if c.MatchedBlocks == 0 || better {
			c.MatchedBlocks, c.Cached = ps.MatchedBlocks, ps.Score
			copy(c.Tiers[:], ps.TierBlocks[:])
			if !q.Candidates[i].HasDPRank {
				c.DPRank, c.HasDPRank = rank, true
			}
		}
	}
	return nil
}

func hasMode(m []EventsMode, want EventsMode) bool {
	for _, v := range m {
		if v == want {
			return true
		}
	}
	return false
}

// matchSpeculative extends the indexed runs of candidates with events by
// their speculative entries, read under each candidate's engine's keys (the
// keys record held them under). A failing shared store costs the
// speculation, not the pick: it is counted and the entries are read as
// absent.
func (ix *Indexer) matchSpeculative(ctx context.Context, model string, r *PickResult) {
	p := ix.pick
	if p.spec == nil || len(r.keys) == 0 || (p.specMem != nil && p.specMem.len() == 0) {
		return
	}
	// one Extend per engine among the candidates (almost always one)
	var seen uint32
	for i, m := range r.mode {
		if m != EventsOn {
			continue
		}
		e := r.keyEngine(i)
		if seen&(1<<e) != 0 {
			continue
		}
		seen |= 1 << e
		ix.extendEngine(ctx, model, r, e)
	}
}

// extendEngine extends the candidates whose keys are engine e's.
func (ix *Indexer) extendEngine(ctx context.Context, model string, r *PickResult, e blockkeys.Engine) {
	r.specAt, r.specHolders, r.start = r.specAt[:0], r.specHolders[:0], r.start[:0]
	var keys []blockkeys.Key
	for i, m := range r.mode {
		if m != EventsOn || r.keyEngine(i) != e {
			continue
		}
		keys = r.keysOf(i)
		if r.Candidates[i].MatchedBlocks < len(keys) {
			r.specAt = append(r.specAt, int32(i))
			r.specHolders = append(r.specHolders, r.holders[i])
			r.start = append(r.start, int32(r.Candidates[i].MatchedBlocks))
		}
	}
	if len(r.specAt) == 0 {
		return
	}
	r.ext = grow(r.ext, len(r.specAt))
	if err := ix.pick.spec.Extend(ctx, model, keys, r.specHolders, r.start, r.ext); err != nil {
		ix.m.specErrors.Inc()
		return
	}
	for j, i := range r.specAt {
		if n := r.ext[j]; n > 0 {
			c := &r.Candidates[i]
			c.MatchedBlocks += int(n)
			c.SpeculativeBlocks = int(n)
			ix.m.specBlocks.Add(float64(n))
		}
	}
}

// keyEngine is the engine whose keys candidate i is matched, and its
// speculative entries held, under: its pod's engine when the request's
// keys were computed for it, else the primary keys' (vLLM, or the caller's
// block_hashes).
func (r *PickResult) keyEngine(i int) blockkeys.Engine {
	if e := r.eng[i]; e != blockkeys.EngineVLLM && r.ek.computed&(1<<e) != 0 {
		return e
	}
	return blockkeys.EngineVLLM
}

// keysOf is candidate i's request keys: the ones the index holds its blocks
// under, so that its engine's BlockStored/BlockRemoved answer (drop) the
// speculative entries held under them.
func (r *PickResult) keysOf(i int) []blockkeys.Key {
	if e := r.keyEngine(i); e != blockkeys.EngineVLLM {
		return r.ek.keys[e]
	}
	return r.keys
}

// podEngine is the engine a candidate's pods (its DP ranks) are indexed
// under: the first one the applier knows, else vLLM's.
func (ix *Indexer) podEngine(ids []kvindex.PodID) blockkeys.Engine {
	for _, id := range ids {
		if e, ok := ix.applier.PodEngine(id); ok {
			return e
		}
	}
	return blockkeys.EngineVLLM
}

// matchHistory matches candidates without events through the routing
// history.
func (ix *Indexer) matchHistory(model string, r *PickResult, now int64) {
	h := ix.pick.hist
	if h == nil || len(r.keys) == 0 || h.len() == 0 || !hasMode(r.mode, EventsOff) {
		return
	}
	h.walk(modelHash(model), r.keys, &r.table, r.run, now)
	for i, m := range r.mode {
		if m == EventsOff {
			r.Candidates[i].MatchedBlocks = int(r.run[i])
		}
	}
}

// record makes the chosen pod the assumed holder of the request's blocks:
// speculatively beyond what it already holds when it has events, in the
// routing history (refreshing the whole prefix) when it has none.
func (ix *Indexer) record(ctx context.Context, model string, r *PickResult, chosen int, now int64) {
	p := ix.pick
	c := &r.Candidates[chosen]
	if r.mode[chosen] == EventsOff {
		if p.hist != nil && len(r.keys) > 0 {
			p.hist.hold(modelHash(model), r.keys, r.holders[chosen], now)
		}
		return
	}
	// under the keys the index holds the pod's blocks under: its own
	// events then drop them (Config.Answered reports those keys)
	keys := r.keysOf(chosen)
	if p.spec == nil || c.MatchedBlocks >= len(keys) {
		return
	}
	if err := p.spec.Hold(ctx, model, keys[c.MatchedBlocks:], r.holders[chosen]); err != nil {
		ix.m.specErrors.Inc()
	}
}

func (t *TierCounts) sum() int32 {
	var n int32
	for _, v := range t {
		n += v
	}
	return n
}
