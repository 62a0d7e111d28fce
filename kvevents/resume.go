package kvevents

// ResumeFrom tells the (pod, dpRank) stream that the index holds a state of
// the pod loaded from a saved index, which this process cannot vouch for.
// The pod is not served (Servable) until a batch of its stream has been
// applied, and the stream is incomplete ("restored") until an engine
// snapshot, a rebuild or a restart replaces that state. Call it before any
// batch of the stream arrives; a stream that already received batches is
// left alone.
//
// With hasSeq, seq is the last sequence number the saved state includes:
// the stream's first batch is treated as it would be after seq, the one
// decision of what the restored state is worth. A forward jump is a gap
// (replayed from seq+1 when the endpoint has a replay address), a jump back
// a restart (the pod is cleared before the batch), the next number a
// continuation (the restored entries are served again). Without hasSeq
// nothing proves the saved state still holds, and the pod is cleared before
// its first batch. Either clear counts in RestoreClears.
//
// An endpoint with a snapshot address replaces the restored state by an
// engine snapshot at the stream's first batch, which also gives the stream
// its epoch (a restored stream has none, and SGLang's replay carries none).
func (s *Subscriber) ResumeFrom(pod string, dpRank int, seq uint64, hasSeq bool) {
	s.resume(pod, dpRank, seq, hasSeq, nil)
}

func (s *Subscriber) resume(pod string, dpRank int, seq uint64, hasSeq bool, vouched *completion) {
	k := streamKey{pod, dpRank}
	// The model is not known until the first batch; admit re-homes the
	// stream's model count then.
	st, _ := s.admit(k, "")
	if st == nil {
		// Over the stream limit: held all the same, until a batch of it
		// is applied.
		s.trust.set(k, trustEntry{hold: holdRestored})
		return
	}
	st.order.Lock()
	defer st.order.Unlock()
	if st.hasSeq {
		return
	}
	s.trust.set(k, trustEntry{hold: holdRestored})
	st.incomplete = true
	st.vouched = vouched
	if hasSeq {
		st.hasSeq, st.lastSeq = true, seq
	} else {
		st.needClear, st.clearWhy = true, whyRestored
	}
	st.mu.Lock()
	st.stats.LastSeq = seq
	st.setCompletionLocked(completion{since: seq + 1, why: whyRestored})
	st.mu.Unlock()
}

// ResumeFromPeer is ResumeFrom (with a sequence number) for a state copied
// from a live peer whose stream was complete since completeSince when the
// copy was taken at seq. The pod is held and incomplete ("restored") as
// after ResumeFrom; if the stream's first batch continues the copy (the
// next number, or a gap the replay fills), the stream is complete since
// completeSince: the peer's run and this one's join with nothing missed.
// A first batch that contradicts the copy (a restart, a gap not replayed)
// is decided as after ResumeFrom.
func (s *Subscriber) ResumeFromPeer(pod string, dpRank int, seq, completeSince uint64) {
	s.resume(pod, dpRank, seq, true, &completion{since: completeSince})
}
