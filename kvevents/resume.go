package kvevents

// ResumeFrom sets the last sequence number of the (pod, dpRank) stream as if
// batch seq had been received, before any batch of it arrives: a daemon
// restarted from a snapshot then treats the stream's first batch as it
// would after seq. A forward jump is a gap (replayed from seq+1 when the
// endpoint has a replay address), a jump back a restart (the pod is
// cleared). A stream that already received batches is left alone.
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
	st.hasSeq, st.lastSeq = true, seq
	st.mu.Lock()
	st.stats.LastSeq = seq
	st.mu.Unlock()
}
