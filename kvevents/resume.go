package kvevents

// ResumeFrom sets the last sequence number of the (pod, dpRank) stream as if
// batch seq had been received, before any batch of it arrives: a daemon
// restarted from a snapshot then treats the stream's first batch as it
// would after seq. A forward jump is a gap (replayed from seq+1 when the
// endpoint has a replay address), a jump back a restart (the pod is
// cleared). A stream that already received batches is left alone.
//
// The restored state is not vouched for (StreamStats.IncompleteReason
// "restored"): an endpoint with a snapshot address replaces it by an engine
// snapshot at the stream's first batch, which also gives the stream its
// epoch (a restored stream has none, and SGLang's replay carries none).
func (s *Subscriber) ResumeFrom(pod string, dpRank int, seq uint64) {
	// The model is not known until the first batch; admit re-homes the
	// stream's model count then.
	st, _ := s.admit(streamKey{pod, dpRank}, "")
	if st == nil {
		return // over the stream limit: the first batch decides
	}
	st.order.Lock()
	defer st.order.Unlock()
	if st.hasSeq {
		return
	}
	st.hasSeq, st.lastSeq, st.incomplete = true, seq, true
	st.mu.Lock()
	st.stats.LastSeq = seq
	st.stats.Complete, st.stats.IncompleteReason, st.stats.CompleteSinceSeq = false, "restored", seq+1
	st.mu.Unlock()
}
