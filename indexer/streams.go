package indexer

import (
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex"
)

// StreamStates is what the score path asks the event subscriber: how late
// the index is for each pod it answers with, and whether the pod's stream
// is complete (*kvevents.Subscriber). The indexer holds the subscriber it
// built; without Config.Events there is none and every answered pod reads
// complete with no lag.
type StreamStates interface {
	StreamStates(refs []kvevents.StreamRef, out []kvevents.StreamState)
}

// servable asks the subscriber, the one owner of a pod's trust, whether the
// index's entries for id may be served (kvevents.Subscriber.Servable). One
// atomic load while no pod is held.
func (ix *Indexer) servable(id kvindex.PodID) bool {
	if ix.sub == nil || ix.sub.AllServable() {
		return true
	}
	name, rank := ix.in.PodName(id)
	return ix.sub.Servable(name, rank)
}

// streamBufs are a Result's buffers for fillStreams, reused across calls.
type streamBufs struct {
	ids    []kvindex.PodID
	refs   []kvevents.StreamRef
	states []kvevents.StreamState
	end    []int // per pod of Result.Pods: the end of its refs
}

// maxKeptStreamRefs bounds the stream buffers a pooled Result keeps.
const maxKeptStreamRefs = 1 << 12

func (b *streamBufs) reset() {
	if cap(b.refs) > maxKeptStreamRefs {
		*b = streamBufs{}
	}
}

// fillStreams sets every answered pod's ApplyLag, Complete and
// IncompleteReason from the subscriber, in one call for the whole answer.
// Every DP rank of the pod counts for the lag (a rank with no match may be
// the one whose blocks are still queued); only the scored ranks count for
// completeness. Nothing is allocated once the buffers have grown.
func (ix *Indexer) fillStreams(r *Result) {
	for i := range r.Pods {
		r.Pods[i].Complete, r.Pods[i].ApplyLag, r.Pods[i].IncompleteReason = true, 0, ""
	}
	if ix.streams == nil || len(r.Pods) == 0 {
		return
	}
	b := &r.streams
	b.refs, b.end = b.refs[:0], b.end[:0]
	for i := range r.Pods {
		name := r.Pods[i].Pod
		b.ids = ix.in.AppendPodsNamed(b.ids[:0], name)
		for _, id := range b.ids {
			_, rank := ix.in.PodName(id)
			b.refs = append(b.refs, kvevents.StreamRef{Pod: name, DPRank: rank})
		}
		b.end = append(b.end, len(b.refs))
	}
	if cap(b.states) < len(b.refs) {
		b.states = make([]kvevents.StreamState, len(b.refs), cap(b.refs))
	}
	b.states = b.states[:len(b.refs)]
	ix.streams.StreamStates(b.refs, b.states)
	start := 0
	for i := range r.Pods {
		p := &r.Pods[i]
		badRank := -1
		for j := start; j < b.end[i]; j++ {
			st := &b.states[j]
			p.ApplyLag = max(p.ApplyLag, st.ApplyLag)
			rank := b.refs[j].DPRank
			if st.Known && !st.Complete && scored(p.Ranks, rank) && (badRank < 0 || rank < badRank) {
				badRank, p.Complete, p.IncompleteReason = rank, false, st.IncompleteReason
			}
		}
		start = b.end[i]
	}
}

func scored(ranks []RankScore, rank int) bool {
	for i := range ranks {
		if ranks[i].DPRank == rank {
			return true
		}
	}
	return false
}
