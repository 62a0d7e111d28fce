package api

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// pickMetrics are the pick request series; decisions by policy and reason
// are the indexer's (kvindexd_picks_total).
type pickMetrics struct {
	requests [codes.Unauthenticated + 1]prometheus.Counter
	duration prometheus.Histogram
}

func newPickMetrics(reg prometheus.Registerer) (*pickMetrics, error) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindexd_pick_requests_total",
		Help: "Pick requests by gRPC status code.",
	}, []string{"code"})
	m := &pickMetrics{duration: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvindexd_pick_duration_seconds",
		Help:    "Pick request time inside the daemon (tokenize + keys + lookup + policy).",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2.5, 16),
	})}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m.requests[c] = vec.WithLabelValues(c.String())
	}
	for _, c := range []prometheus.Collector{vec, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *pickMetrics) observe(c codes.Code, d time.Duration) {
	if c > codes.Unauthenticated {
		c = codes.Unknown
	}
	m.requests[c].Inc()
	m.duration.Observe(d.Seconds())
}

// pickScratch is one pick request's reused state: the candidates decoded
// from the request and the indexer's result.
type pickScratch struct {
	query indexer.PickQuery
	res   indexer.PickResult
	// HTTP only
	body scoreBody
	out  []byte
}

var pickPool = sync.Pool{New: func() any { return new(pickScratch) }}

func putPick(p *pickScratch) {
	// Keep pooled buffers bounded: one huge request must not pin memory.
	if cap(p.query.Candidates) > indexer.MaxCandidates || cap(p.out) > 1<<20 || cap(p.body.tokens) > 1<<20 {
		return
	}
	p.res.Reset()
	clear(p.query.Candidates)
	p.query = indexer.PickQuery{Candidates: p.query.Candidates[:0]}
	pickPool.Put(p)
}

// pick runs one pick through the indexer and records its metrics.
func (s *Server) pick(ctx context.Context, p *pickScratch) *Error {
	start := time.Now()
	var e *Error
	if err := s.idx.Pick(ctx, &p.query, &p.res); err != nil {
		e = fromIndexer(err)
	}
	code := codes.OK
	if e != nil {
		code = e.Code
	}
	s.pickMetrics.observe(code, time.Since(start))
	return e
}

// Pick implements kvindex.v1.Indexer/Pick.
func (s *Server) Pick(ctx context.Context, req *kvindexv1.PickRequest) (*kvindexv1.PickResponse, error) {
	p := pickPool.Get().(*pickScratch)
	defer putPick(p)
	ctx, span := s.startGRPC(ctx, spanGRPCPick, grpcMethodPick)
	start := time.Now()
	q := &p.query
	if e := s.pickRequest(req, q); e != nil {
		s.pickMetrics.observe(e.Code, 0)
		endRequest(span, true, nil, e)
		return nil, e.grpc()
	}
	s.stage(indexer.OpPick, indexer.StageParse, start)
	err := s.pick(ctx, p)
	endRequest(span, true, &q.Query, err)
	if err != nil {
		return nil, err.grpc()
	}
	start = time.Now()
	resp := toProtoPick(&p.res)
	s.stage(indexer.OpPick, indexer.StageEncode, start)
	return resp, nil
}

// pickRequest decodes a gRPC PickRequest into q.
func (s *Server) pickRequest(req *kvindexv1.PickRequest, q *indexer.PickQuery) *Error {
	q.Model, q.LoraName, q.CacheSalt, q.Policy, q.SessionID = req.GetModel(), req.GetLoraName(), req.GetCacheSalt(), req.GetPolicy(), req.GetSessionId()
	if _, e := setGRPCInput(&q.Query, req.GetInput(), req.AddSpecialTokens); e != nil {
		return e
	}
	if len(req.GetCandidates()) > indexer.MaxCandidates {
		return errorf(codes.InvalidArgument, "candidates has %d entries, limit %d", len(req.GetCandidates()), indexer.MaxCandidates)
	}
	for _, c := range req.GetCandidates() {
		ic := indexer.Candidate{Pod: c.GetPod(), Load: routing.Load{Waiting: int(c.GetWaiting()), Running: int(c.GetRunning()), KVUsage: c.GetKvUsage()}}
		if c.DpRank != nil {
			ic.DPRank, ic.HasDPRank = int(c.GetDpRank()), true
		}
		if c.Events != nil {
			ic.Events = indexer.EventsOff
			if c.GetEvents() {
				ic.Events = indexer.EventsOn
			}
		}
		var ok bool
		if ic.Role, ok = routing.ParseRole(c.GetRole()); !ok {
			return errorf(codes.InvalidArgument, "candidates[%d].role: %v", len(q.Candidates), badRole(c.GetRole()))
		}
		q.Candidates = append(q.Candidates, ic)
	}
	return nil
}

func toProtoPick(a *indexer.PickResult) *kvindexv1.PickResponse {
	resp := &kvindexv1.PickResponse{Pod: a.Pod, Policy: a.Policy, Reason: a.Reason.String(), TotalBlocks: int32(a.TotalBlocks), PickId: FormatPickID(a.PickID),
		Candidates: make([]*kvindexv1.CandidateResult, len(a.Candidates))}
	if a.HasDPRank {
		r := int32(a.DPRank)
		resp.DpRank = &r
	}
	// One backing array per kind: allocations constant in the candidates.
	cands := make([]kvindexv1.CandidateResult, len(a.Candidates))
	tiers := make([]kvindexv1.TierCounts, len(a.Candidates))
	ranks := make([]int32, len(a.Candidates))
	for i := range a.Candidates {
		c, pc := &a.Candidates[i], &cands[i]
		pc.Pod = c.Pod
		if c.HasDPRank {
			ranks[i] = int32(c.DPRank)
			pc.DpRank = &ranks[i]
		}
		pc.MatchedBlocks, pc.SpeculativeBlocks, pc.Approximate = int32(c.MatchedBlocks), int32(c.SpeculativeBlocks), c.Approximate
		pc.Tiers = fillTiers(&tiers[i], &c.Tiers)
		pc.Cached, pc.Score, pc.Cost = finiteOr0(c.Cached), finiteOr0(c.Score), finiteOr0(c.Cost)
		pc.Session = c.Session
		if a.PD {
			pc.Role = c.Role.String()
		}
		resp.Candidates[i] = pc
	}
	if a.PD {
		resp.Disaggregation = &kvindexv1.Disaggregation{Decision: a.Split.String(), NonCachedTokens: int32(a.NonCachedTokens),
			PrefillWaiting: int32(a.PrefillWaiting), MaxLocalPrefillTokens: int32(a.PDParams.MaxLocalPrefillTokens),
			MaxPrefillWaiting: int32(a.PDParams.MaxPrefillWaiting)}
	}
	if a.Prefill >= 0 {
		pp := &kvindexv1.PrefillPod{Pod: a.PrefillPod, Candidate: int32(a.Prefill), Reason: a.PrefillReason.String(),
			MatchedBlocks: int32(a.Candidates[a.Prefill].MatchedBlocks)}
		if a.PrefillHasDPRank {
			r := int32(a.PrefillDPRank)
			pp.DpRank = &r
		}
		resp.PrefillPod = pp
	}
	if a.HasKVSource {
		k := &a.KVSource
		ks := &kvindexv1.KVSource{Pod: k.Pod, Blocks: int32(k.Blocks), ExtraBlocks: int32(k.ExtraBlocks),
			Tiers: fillTiers(new(kvindexv1.TierCounts), &k.Tiers), Reason: kvSourceReason}
		if k.HasDPRank {
			r := int32(k.DPRank)
			ks.DpRank = &r
		}
		if k.Candidate >= 0 {
			c := int32(k.Candidate)
			ks.Candidate = &c
		}
		resp.KvSource = ks
	}
	return resp
}

// kvSourceReason is kv_source's reason: the only one there is.
const kvSourceReason = "holds-more-blocks"

// badRole is the error of an unknown role value.
func badRole(v string) error {
	return fmt.Errorf("unknown role %q (want prefill, decode, both, prefill-decode or encode; empty = both)", v)
}

func finiteOr0(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

func (s *Server) handlePick(w http.ResponseWriter, r *http.Request) {
	p := pickPool.Get().(*pickScratch)
	defer putPick(p)
	ctx, span := s.startHTTP(r, spanHTTPPick, routePick)
	start := time.Now()
	sc := httpPool.Get().(*httpScratch)
	sc.buf.Reset()
	_, err := sc.buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		err = parsePickBody(sc.buf.Bytes(), p)
	}
	if sc.buf.Cap() <= 4<<20 {
		httpPool.Put(sc)
	}
	if err != nil {
		e, ok := err.(*Error) // from the input's own checks, with its code
		if !ok {
			e = errorf(codes.InvalidArgument, "%v", err)
		}
		s.pickMetrics.observe(e.Code, 0)
		endRequest(span, false, nil, e)
		writeError(w, e)
		return
	}
	s.stage(indexer.OpPick, indexer.StageParse, start)
	e := s.pick(ctx, p)
	endRequest(span, false, &p.query.Query, e)
	if e != nil {
		writeError(w, e)
		return
	}
	start = time.Now()
	p.out = appendPickJSON(p.out[:0], &p.res)
	s.stage(indexer.OpPick, indexer.StageEncode, start)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(p.out)))
	_, _ = w.Write(p.out)
}

// parsePickBody decodes a POST /v1/pick body into p.q: the score request's
// fields plus "candidates" and "policy". The body buffer must outlive p.q
// only until the pick is answered (strings are copied).
func parsePickBody(data []byte, p *pickScratch) error {
	b := &p.body
	*b = scoreBody{tokens: b.tokens[:0], hashes: b.hashes[:0], pods: b.pods[:0]}
	q := &p.query
	q.Candidates = q.Candidates[:0]
	s := scanner{b: data}
	err := s.object(func(key string) error {
		switch key {
		case "policy":
			v, _, err := s.optStr(key)
			q.Policy = v
			return err
		case "candidates":
			q.Candidates = q.Candidates[:0]
			return s.array(key, func(i int) error {
				if i == indexer.MaxCandidates {
					return fmt.Errorf("candidates has more than %d entries", indexer.MaxCandidates)
				}
				var c indexer.Candidate
				if err := s.candidate(i, &c); err != nil {
					return err
				}
				q.Candidates = append(q.Candidates, c)
				return nil
			})
		}
		return s.scoreField(key, b)
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return err
	}
	if e := b.query(&q.Query); e != nil {
		return e
	}
	return nil
}

// candidate reads one {"pod", "dp_rank", "waiting", "running", "kv_usage",
// "events", "role"} object.
func (s *scanner) candidate(i int, c *indexer.Candidate) error {
	return s.object(func(key string) error {
		var err error
		var v int64
		switch key {
		case "pod":
			c.Pod, err = s.str()
		case "dp_rank":
			if s.null() {
				return nil
			}
			v, err = s.int("candidates.dp_rank", i)
			c.DPRank, c.HasDPRank = int(v), true
		case "waiting":
			v, err = s.int("candidates.waiting", i)
			c.Waiting = int(v)
		case "running":
			v, err = s.int("candidates.running", i)
			c.Running = int(v)
		case "kv_usage":
			c.KVUsage, err = s.float()
		case "role":
			if s.null() {
				return nil
			}
			var v string
			if v, err = s.str(); err == nil {
				var ok bool
				if c.Role, ok = routing.ParseRole(v); !ok {
					err = badRole(v)
				}
			}
		case "events":
			if s.null() {
				return nil
			}
			var on bool
			if on, err = s.bool(); err == nil {
				c.Events = indexer.EventsOff
				if on {
					c.Events = indexer.EventsOn
				}
			}
		default:
			return fmt.Errorf("candidates[%d]: unknown field %q (want pod, dp_rank, waiting, running, kv_usage, events, role)", i, key)
		}
		if err != nil {
			return fmt.Errorf("candidates[%d].%s: %v", i, key, err)
		}
		// int64 values beyond int32 are not counts a router reports
		if v > math.MaxInt32 || v < math.MinInt32 {
			return fmt.Errorf("candidates[%d].%s is out of range", i, key)
		}
		return nil
	})
}

// float reads a JSON number.
func (s *scanner) float() (float64, error) {
	start := s.p
	s.number()
	f, err := strconv.ParseFloat(string(s.b[start:s.p]), 64)
	if err != nil || start == s.p {
		return 0, s.errorf("expected a number")
	}
	return f, nil
}

func (s *scanner) bool() (bool, error) {
	switch {
	case len(s.b)-s.p >= 4 && string(s.b[s.p:s.p+4]) == "true":
		s.p += 4
		return true, nil
	case len(s.b)-s.p >= 5 && string(s.b[s.p:s.p+5]) == "false":
		s.p += 5
		return false, nil
	}
	return false, s.errorf("expected true or false")
}

// appendPickJSON writes the pick answer without reflection.
func appendPickJSON(b []byte, a *indexer.PickResult) []byte {
	b = append(b, `{"pod":`...)
	b = appendString(b, a.Pod)
	b = append(b, `,"dp_rank":`...)
	b = appendOptRank(b, a.HasDPRank, a.DPRank)
	b = append(b, `,"policy":`...)
	b = appendString(b, a.Policy)
	b = append(b, `,"reason":`...)
	b = appendString(b, a.Reason.String())
	b = append(b, `,"pick_id":"`...)
	b = appendPickID(b, a.PickID)
	b = append(b, `","total_blocks":`...)
	b = strconv.AppendInt(b, int64(a.TotalBlocks), 10)
	b = append(b, `,"candidates":[`...)
	for i := range a.Candidates {
		c := &a.Candidates[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"pod":`...)
		b = appendString(b, c.Pod)
		b = append(b, `,"dp_rank":`...)
		b = appendOptRank(b, c.HasDPRank, c.DPRank)
		b = append(b, `,"matched_blocks":`...)
		b = strconv.AppendInt(b, int64(c.MatchedBlocks), 10)
		b = append(b, `,"speculative_blocks":`...)
		b = strconv.AppendInt(b, int64(c.SpeculativeBlocks), 10)
		b = append(b, `,"approximate":`...)
		b = strconv.AppendBool(b, c.Approximate)
		b = append(b, `,"tiers":`...)
		b = appendTiers(b, &c.Tiers)
		b = append(b, `,"cached":`...)
		b = appendFloat(b, c.Cached)
		b = append(b, `,"score":`...)
		b = appendFloat(b, c.Score)
		b = append(b, `,"cost":`...)
		b = appendFloat(b, c.Cost)
		if c.Session {
			b = append(b, `,"session":true`...)
		}
		if a.PD {
			b = append(b, `,"role":`...)
			b = appendString(b, c.Role.String())
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	if a.PD {
		b = appendPDJSON(b, a)
	}
	return append(b, "}\n"...)
}

// appendPDJSON writes a P/D answer's disaggregation, prefill_pod and
// kv_source (the last two only when set).
func appendPDJSON(b []byte, a *indexer.PickResult) []byte {
	b = append(b, `,"disaggregation":{"decision":`...)
	b = appendString(b, a.Split.String())
	b = append(b, `,"non_cached_tokens":`...)
	b = strconv.AppendInt(b, int64(a.NonCachedTokens), 10)
	b = append(b, `,"prefill_waiting":`...)
	b = strconv.AppendInt(b, int64(a.PrefillWaiting), 10)
	b = append(b, `,"max_local_prefill_tokens":`...)
	b = strconv.AppendInt(b, int64(a.PDParams.MaxLocalPrefillTokens), 10)
	b = append(b, `,"max_prefill_waiting":`...)
	b = strconv.AppendInt(b, int64(a.PDParams.MaxPrefillWaiting), 10)
	b = append(b, '}')
	if a.Prefill >= 0 {
		b = append(b, `,"prefill_pod":{"pod":`...)
		b = appendString(b, a.PrefillPod)
		b = append(b, `,"dp_rank":`...)
		b = appendOptRank(b, a.PrefillHasDPRank, a.PrefillDPRank)
		b = append(b, `,"candidate":`...)
		b = strconv.AppendInt(b, int64(a.Prefill), 10)
		b = append(b, `,"reason":`...)
		b = appendString(b, a.PrefillReason.String())
		b = append(b, `,"matched_blocks":`...)
		b = strconv.AppendInt(b, int64(a.Candidates[a.Prefill].MatchedBlocks), 10)
		b = append(b, '}')
	}
	if a.HasKVSource {
		k := &a.KVSource
		b = append(b, `,"kv_source":{"pod":`...)
		b = appendString(b, k.Pod)
		b = append(b, `,"dp_rank":`...)
		b = appendOptRank(b, k.HasDPRank, k.DPRank)
		b = append(b, `,"candidate":`...)
		b = appendOptRank(b, k.Candidate >= 0, k.Candidate)
		b = append(b, `,"blocks":`...)
		b = strconv.AppendInt(b, int64(k.Blocks), 10)
		b = append(b, `,"extra_blocks":`...)
		b = strconv.AppendInt(b, int64(k.ExtraBlocks), 10)
		b = append(b, `,"tiers":`...)
		b = appendTiers(b, &k.Tiers)
		b = append(b, `,"reason":"`+kvSourceReason+`"}`...)
	}
	return b
}

func appendOptRank(b []byte, ok bool, rank int) []byte {
	if !ok {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, int64(rank), 10)
}
