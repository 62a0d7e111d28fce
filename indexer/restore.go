package indexer

// Pods loaded from a snapshot are decided by their streams (kvevents'
// ResumeFrom): held, listed but not scored, until a batch of theirs has been
// applied; cleared before it when the engine restarted since the snapshot
// (the batch's seq at or below the snapshot's) or when the snapshot does
// not say where the stream was. The indexer only tells the subscriber what
// it loaded (resumeRestored) and asks it afterwards.

// StalePods is how many restored pods still wait for their stream.
func (ix *Indexer) StalePods() int {
	if ix.sub == nil {
		return 0
	}
	return ix.sub.RestoredWaiting()
}
