package indexer

import (
	"cmp"
	"slices"

	"github.com/kvindex/kvindex/kvindex"
)

// Session affinity (vLLM's BlockStored.session_id, PR #51381): the applier
// remembers which pods stored blocks for which session (kvindex
// sessions.go). A query naming a session prefers those pods, but only where
// the cache says nothing: a longer or better-tiered match always wins.

// preferSession marks r's pods that stored blocks for session and moves
// them first among pods with the same score and matched blocks.
func (ix *Indexer) preferSession(session string, r *Result) {
	r.sess = ix.applier.SessionPods(r.sess[:0], session)
	if len(r.sess) == 0 {
		return
	}
	for i := range r.Pods {
		r.Pods[i].Session = ix.holdsSession(r.sess, r.Pods[i].Pod, 0, false)
	}
	slices.SortStableFunc(r.Pods, func(a, b PodResult) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		if c := cmp.Compare(b.MatchedBlocks, a.MatchedBlocks); c != 0 {
			return c
		}
		if a.Session != b.Session {
			if a.Session {
				return -1
			}
			return 1
		}
		return 0
	})
}

// holdsSession reports whether one of ids is pod (at rank when hasRank).
func (ix *Indexer) holdsSession(ids []kvindex.PodID, pod string, rank int, hasRank bool) bool {
	for _, id := range ids {
		if name, rk := ix.in.PodName(id); name == pod && (!hasRank || rk == rank) {
			return true
		}
	}
	return false
}

// pickSession marks the candidates that stored blocks for session and
// returns the candidate to choose: the policy's choice, unless it is not a
// session candidate and a session candidate ties with it on everything the
// policy weighed (matched blocks, cached, score and cost). The first such
// candidate in query order wins.
func (ix *Indexer) pickSession(q *PickQuery, r *PickResult, chosen int) int {
	r.sess = ix.applier.SessionPods(r.sess[:0], q.SessionID)
	if len(r.sess) == 0 {
		return chosen
	}
	for i := range r.Candidates {
		// a rank the query did not name is any rank of the pod
		qc := &q.Candidates[i]
		r.Candidates[i].Session = ix.holdsSession(r.sess, qc.Pod, qc.DPRank, qc.HasDPRank)
	}
	ch := &r.Candidates[chosen]
	if ch.Session {
		return chosen
	}
	for i := range r.Candidates {
		c := &r.Candidates[i]
		if r.PD && !q.Candidates[i].Role.Decodes() {
			continue // a P/D pick's pod must decode
		}
		if c.Session && c.MatchedBlocks == ch.MatchedBlocks && c.Cached == ch.Cached && c.Score == ch.Score && c.Cost == ch.Cost {
			return i
		}
	}
	return chosen
}
