package kvevents

// The index backend can lose what the sink wrote without any batch being
// lost: a Redis restarted empty or evicting keys (the composition root,
// which owns the backend, reports it: MarkIndexLost), or a pod's write that
// failed and made the sink clear it (the sink's ApplyOutcome, recorded on
// the pod's worker: trust.go). The streams would still say complete, and
// the pod would be rebuilt from later events only. The streams say so at
// once, and their next batch asks the snapshot endpoint when there is one,
// as after a gap, and a stream whose endpoint has only a replay address
// (vLLM) is rebuilt from the engine's replay buffer at once (rebuild.go).
// They become complete again only by what rebuilds the whole state: an
// engine snapshot, a rebuild that replayed the lifetime from its start, the
// engine's own AllBlocksCleared, or a restart.

// MarkIndexLost marks every stream incomplete with reason (StreamStats
// IncompleteReason, e.g. "index_lost"): the backend cannot say whose
// entries it lost.
func (s *Subscriber) MarkIndexLost(reason string) {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	for _, st := range all {
		st.markIndexLost(reason)
		s.scheduleRebuild(st)
	}
}

// markPodIndexLost marks the stream k incomplete with reason; an unknown
// stream is ignored.
func (s *Subscriber) markPodIndexLost(k streamKey, reason string) {
	s.mu.Lock()
	st := s.streams[k]
	s.mu.Unlock()
	if st != nil {
		st.markIndexLost(reason)
		s.scheduleRebuild(st)
	}
}

// markIndexLost takes only st.mu: the caller may be the sink, which runs
// while a reader holds st.order waiting for its queue. A stream already
// incomplete keeps its reason (the first break in its run; both are repaired
// the same way), except a tentative "message_lost", which this settles.
func (st *stream) markIndexLost(reason string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.indexLost = true
	if !st.stats.Complete && st.lostFrom == nil {
		return
	}
	st.setCompletionLocked(completion{since: st.stats.LastSeq + 1, why: reason})
}

// MarkEvicted marks the stream of (pod, dpRank) incomplete with
// "evicted_for_capacity": the index dropped some of the pod's blocks to stay
// within its capacity (the composition root relays the memory index's
// report), so its answers may miss blocks the pod holds. It stays so until
// what proves the pod's state whole again, as after "index_lost": an engine
// snapshot (asked at the stream's next batch when the endpoint has one),
// the engine's own AllBlocksCleared, or a restart. Unlike a loss no rebuild
// by replay is started: re-adding a pod's lifetime to a full index would
// evict another pod's blocks, and so on round the fleet. An unknown stream
// (another daemon's) is ignored.
func (s *Subscriber) MarkEvicted(pod string, dpRank int) {
	s.mu.Lock()
	st := s.streams[streamKey{pod, dpRank}]
	s.mu.Unlock()
	if st != nil {
		st.markIndexLost(whyEvicted)
	}
}

// Rebuilding is how many streams still say "index_lost": the backend lost
// entries and neither a snapshot, a rebuild nor the engine has replaced
// those pods' state yet. The score path reads it with one atomic load to
// say so in every answer (an empty answer then means "rebuilding", not
// "no pod holds the prompt").
func (s *Subscriber) Rebuilding() int { return int(s.lostStreams.Load()) }
