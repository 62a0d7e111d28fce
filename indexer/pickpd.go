package indexer

import (
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvindex"
)

// Disaggregated prefill/decode picks. The decisions are routing.PickPD and
// routing.KVSource (pure, shared with the simulator); this file feeds them
// the index's numbers and fills the answer.

// pdQuery reports whether q is a P/D pick: some candidate has a role other
// than both. A query of RoleBoth candidates only takes the aggregated path
// unchanged.
func pdQuery(q *PickQuery) bool {
	for i := range q.Candidates {
		if q.Candidates[i].Role != routing.RoleBoth {
			return true
		}
	}
	return false
}

// pickPD chooses the pair over r.rc (filled) and sets the answer's P/D
// fields; the caller names the decode pod.
func (ix *Indexer) pickPD(p routing.Policy, req routing.Request, q *PickQuery, r *PickResult) (routing.PDChoice, *Error) {
	n := len(q.Candidates)
	r.roles, r.sub, r.at = grow(r.roles, n), grow(r.sub, n), grow(r.at, n)
	for i := range q.Candidates {
		r.roles[i] = q.Candidates[i].Role
	}
	ch, err := routing.PickPD(p, ix.pick.pd, req, r.rc, r.roles, r.sub, r.at)
	if err != nil {
		return ch, errorf(InvalidArgument, "candidates: %v", err)
	}
	r.Split, r.NonCachedTokens, r.PrefillWaiting = ch.Split, ch.NonCached, ch.PrefillWaiting
	if ch.Prefill >= 0 {
		c := &r.Candidates[ch.Prefill]
		r.Prefill, r.PrefillPod, r.PrefillDPRank, r.PrefillHasDPRank = ch.Prefill, c.Pod, c.DPRank, c.HasDPRank
		r.PrefillReason = ch.PrefillReason
	}
	ix.m.pdSplits[ch.Split].Inc()
	return ch, nil
}

// offerSource keeps the best holder of the request that is no candidate
// (most blocks, then the faster tiers, then the lower id), a kv_source
// candidate.
func (r *PickResult) offerSource(ps kvindex.PodScore) {
	b := &r.srcScore
	if !r.srcOK || ps.MatchedBlocks > b.MatchedBlocks || (ps.MatchedBlocks == b.MatchedBlocks && ps.Score > b.Score) {
		r.srcOK, r.srcPod, r.srcScore = true, ps.Pod, ps
	}
}

// finishPD names the kv_source once the pair is chosen: among the
// candidates that are neither chosen pod (their own confirmed blocks only)
// and the best holder that is no candidate.
func (ix *Indexer) finishPD(q *PickQuery, r *PickResult, gpu float64) {
	have := r.Candidates[r.Chosen].MatchedBlocks
	if r.Prefill >= 0 {
		have = max(have, r.Candidates[r.Prefill].MatchedBlocks)
	}
	r.src, r.srcAt = r.src[:0], r.srcAt[:0]
	for i := range r.Candidates {
		c := &r.Candidates[i]
		if i == r.Chosen || i == r.Prefill || c.Approximate {
			continue
		}
		own := c.MatchedBlocks - c.SpeculativeBlocks
		if own <= have {
			continue
		}
		r.src = append(r.src, routing.Source{Matched: own, Cached: c.Cached - float64(c.SpeculativeBlocks)*gpu})
		r.srcAt = append(r.srcAt, int32(i))
	}
	if r.srcOK && r.srcScore.MatchedBlocks > have {
		r.src = append(r.src, routing.Source{Matched: r.srcScore.MatchedBlocks, Cached: r.srcScore.Score})
		r.srcAt = append(r.srcAt, -1)
	}
	best := routing.KVSource(have, r.src)
	if best < 0 {
		return
	}
	s := &r.KVSource
	s.Blocks, s.ExtraBlocks = r.src[best].Matched, r.src[best].Matched-have
	if i := r.srcAt[best]; i >= 0 {
		c := &r.Candidates[i]
		s.Pod, s.DPRank, s.HasDPRank, s.Candidate, s.Tiers = c.Pod, c.DPRank, c.HasDPRank, int(i), c.Tiers
	} else {
		s.Pod, s.DPRank = ix.in.PodName(r.srcPod)
		s.HasDPRank, s.Candidate = true, -1
		copy(s.Tiers[:], r.srcScore.TierBlocks[:])
	}
	r.HasKVSource = true
	ix.m.pdSources.Inc()
}
