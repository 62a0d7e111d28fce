package kvevents

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// This file is the one owner of a pod's trust: whether the index's entries
// for a (pod, dp rank) may be served, and whether they are complete and why
// not. Two answers, one place:
//
//   - Complete / CompleteSinceSeq / IncompleteReason (StreamStats) say whether
//     the index holds every batch of the pod's lifetime; the reader sets them
//     from the sequence decision (sequence.go), the worker from the sink's
//     ApplyOutcome (index_error), the composition root from a backend loss
//     (MarkIndexLost, index_lost).
//   - The hold says whether the entries may be served at all (Servable): a
//     pod loaded from a saved index is held until a batch of its stream has
//     been applied (restored, see ResumeFrom), a pod whose index write failed
//     until the sink reports a clear that went through (index_error).
//
// The sink reports (event.ApplyOutcome) and never decides; the read path
// (scores, picks, pod listings) asks StreamStates here and nowhere else
// (Servable is its one-pod shortcut for the score path's filter). A hold outlives its stream: a pod forgotten (expired, endpoint
// removed) whose clear failed stays held, and recovered, until a clear of it
// goes through.

// Why a stream is incomplete (StreamStats.IncompleteReason; "" = complete):
// the one vocabulary, documented at StreamStats.Complete.
const (
	whyJoinedLate   = "joined_late"
	whyReplayWindow = "replay_window"
	whyGap          = "gap"
	whyRestart      = "restart"
	whyOverflow     = "overflow"
	whyMessageLost  = "message_lost"
	whyDisconnected = "disconnected"
	whyRestored     = "restored"
	whyIndexLost    = "index_lost"
	whyIndexError   = "index_error"
	whyEvicted      = "evicted_for_capacity"
	// whySnapshotApplying is never stored: it is reported while an engine
	// snapshot of a stream complete by its sequence is still being applied
	// (stream.go, reported).
	whySnapshotApplying = "snapshot_applying"
)

// completion is what a stream says of its completeness: the index holds its
// batches from since on, and why the run does not reach back to an empty
// cache ("" when it does).
type completion struct {
	since uint64
	why   string
}

// setCompletionLocked is the one writer of StreamStats' completeness. It
// settles a tentative "message_lost" (lost.go): whatever sets completeness
// knows more than that mark did. st.mu is held.
func (st *stream) setCompletionLocked(c completion) {
	if st.lostCount != nil && (st.stats.IncompleteReason == whyIndexLost) != (c.why == whyIndexLost) {
		if c.why == whyIndexLost {
			st.lostCount.Add(1)
		} else {
			st.lostCount.Add(-1)
		}
	}
	st.stats.Complete, st.stats.IncompleteReason, st.stats.CompleteSinceSeq = c.why == "", c.why, c.since
	st.lostFrom = nil
}

// completionLocked is what the stream says now. st.mu is held.
func (st *stream) completionLocked() completion {
	return completion{since: st.stats.CompleteSinceSeq, why: st.stats.IncompleteReason}
}

// hold is why a pod's entries are not served.
type hold uint8

const (
	served hold = iota
	// holdRestored: loaded from a saved index; its stream has not shown yet
	// whether the engine still holds it.
	holdRestored
	// holdIndexError: a write of the pod's failed; the sink clears it
	// before its next batch, and recovery queues that clear for a pod that
	// stays quiet.
	holdIndexError
)

var holdNames = [...]string{"", "restored", "index_error"}

func (h hold) String() string { return holdNames[h] }

// trustEntry is a held pod; model and engine name its clear (recover),
// and recovering says one is queued: at most one per pod, so a backend
// that hangs each clear for its call deadline cannot fill the worker's
// queue with them.
type trustEntry struct {
	hold       hold
	model      string
	engine     blockkeys.Engine
	recovering bool
}

// trustTable holds the pods not served. n lets the read path skip the lookup
// when every pod is served, the normal case.
type trustTable struct {
	n  atomic.Int32
	mu sync.RWMutex
	by map[streamKey]trustEntry
	// restoreClears counts restored pods cleared at their first batch (the
	// engine restarted since the snapshot, or the snapshot had no seq).
	restoreClears atomic.Uint64
}

func (t *trustTable) get(k streamKey) hold {
	if t.n.Load() == 0 {
		return served
	}
	t.mu.RLock()
	e := t.by[k]
	t.mu.RUnlock()
	return e.hold
}

// set records k's hold; model and engine are kept when e leaves them empty,
// a queued recovery while the hold stays.
func (t *trustTable) set(k streamKey, e trustEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.hold == served {
		delete(t.by, k)
	} else {
		if t.by == nil {
			t.by = map[streamKey]trustEntry{}
		}
		if old, ok := t.by[k]; ok {
			if e.model == "" {
				e.model, e.engine = old.model, old.engine
			}
			e.recovering = old.recovering && old.hold == e.hold
		}
		t.by[k] = e
	}
	t.n.Store(int32(len(t.by)))
}

// setRecovering marks k's recovery clear queued (on) or done; false if k is
// not held for an index error, or (on) already has one queued.
func (t *trustTable) setRecovering(k streamKey, on bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.by[k]
	if !ok || e.hold != holdIndexError || on && e.recovering {
		return false
	}
	e.recovering = on
	t.by[k] = e
	return true
}

// count is how many pods are held for h.
func (t *trustTable) count(h hold) int {
	if t.n.Load() == 0 {
		return 0
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, e := range t.by {
		if e.hold == h {
			n++
		}
	}
	return n
}

// held lists the pods held for h.
func (t *trustTable) held(h hold) map[streamKey]trustEntry {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := map[streamKey]trustEntry{}
	for k, e := range t.by {
		if e.hold == h {
			out[k] = e
		}
	}
	return out
}

// Servable reports whether the index's entries for (pod, dpRank) may be
// served: false while the pod is held (restored and not resumed, or after a
// failed index write until its clear went through). A pod this subscriber
// never saw is servable: another daemon sharing the index may publish it.
// One atomic load while no pod is held.
func (s *Subscriber) Servable(pod string, dpRank int) bool {
	return s.trust.get(streamKey{pod, dpRank}) == served
}

// AllServable reports whether no pod is held, with one atomic load: the
// score path asks it before naming the pods it would ask Servable about.
func (s *Subscriber) AllServable() bool { return s.trust.n.Load() == 0 }

// RestoredWaiting is how many pods loaded from a saved index still wait for
// a batch of their stream (ResumeFrom).
func (s *Subscriber) RestoredWaiting() int { return s.trust.count(holdRestored) }

// RestoreClears is how many restored pods were cleared at their first batch,
// the engine having restarted since the snapshot (or the snapshot not saying
// where the stream was).
func (s *Subscriber) RestoreClears() uint64 { return s.trust.restoreClears.Load() }

// applied records the sink's outcome for b, on the pod's worker right after
// Apply, so it is ordered with the pod's batches: a failed write holds the
// pod and marks its stream incomplete ("index_error"), asking for a rebuild
// as after a backend loss; any batch that went through serves the pod
// again (its stream keeps the reason until a snapshot or rebuild replaces
// the pod's state).
func (s *Subscriber) applied(b *event.Batch, o event.ApplyOutcome) {
	k := streamKey{b.Pod, b.DPRank}
	if o.IndexFailed {
		s.trust.set(k, trustEntry{hold: holdIndexError, model: b.Model, engine: b.Engine})
		s.markPodIndexLost(k, whyIndexError)
		return
	}
	if s.trust.get(k) != served {
		s.trust.set(k, trustEntry{})
	}
}

// recoveryDue reports whether a recovery clear for b is still wanted, and
// lets recover queue the pod's next one: a batch applied since it was queued
// may have cleared the pod already, and the clear would then drop what that
// batch stored. The worker asks, so the answer cannot change before the
// clear applies.
func (s *Subscriber) recoveryDue(b *event.Batch) bool {
	return s.trust.setRecovering(streamKey{b.Pod, b.DPRank}, false)
}

// recoveryInterval is how often recover runs.
const recoveryInterval = time.Second

// recoverLoop runs recover every interval until ctx ends.
func (s *Subscriber) recoverLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.recover(ctx)
		}
	}
}

// recover queues a clear for every pod held after a failed write, on its
// worker: a pod that publishes again is cleared before its next batch
// anyway, but a quiet one would stay out of scores for good. That includes
// a pod whose stream was forgotten (expired, endpoint removed) while its
// clear failed: its entries are still in the index. While the index still
// fails, the clear's outcome keeps the hold.
func (s *Subscriber) recover(ctx context.Context) {
	for k, e := range s.trust.held(holdIndexError) {
		if !s.trust.setRecovering(k, true) {
			continue // one is queued still, or the pod was cleared meanwhile
		}
		s.mu.Lock()
		st := s.streams[k]
		s.mu.Unlock()
		w := s.dispatcher.workerFor(k)
		b := &event.Batch{Pod: k.pod, DPRank: k.rank, Model: e.model, Engine: e.engine,
			Events: []event.Event{{Kind: event.AllBlocksCleared}}}
		if st != nil {
			b.Seq = st.currentStats().LastSeq
		}
		if err := s.dispatcher.queueRecovery(ctx, w, b); err != nil {
			s.trust.setRecovering(k, false)
			return
		}
		s.metrics.SyntheticClears.WithLabelValues(whyIndexError).Inc()
	}
}
