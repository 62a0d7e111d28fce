package kvevents

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// StreamStats describes one (pod, data-parallel rank) stream.
type StreamStats struct {
	Pod             string
	DPRank          int
	Model           string
	Endpoint        string // the endpoint (or bind address) it arrives on
	Role            string // the endpoint's P/D role (EndpointConfig.Role)
	Engine          blockkeys.Engine
	LastSeq         uint64
	Batches         uint64 // live batches accepted
	SeqGaps         uint64 // forward jumps
	MissedBatches   uint64 // batches skipped by those jumps
	ReplayedBatches uint64 // of which recovered by replay
	Replaying       bool   // a replay exchange for a gap is in progress
	// Rebuilding: the index lost the pod's entries and a rebuild from the
	// engine's replay buffer is waiting or in progress (rebuild.go).
	Rebuilding     bool
	RebuiltBatches uint64 // batches queued by rebuilds
	Restarts       uint64 // backward jumps (engine restarts)
	DecodeErrors   uint64 // malformed events dropped
	Overflows      uint64 // batches dropped on a full queue
	// Complete is true when the sink has seen every batch of the current
	// publisher lifetime since its cache was last empty (seq 0, or an
	// AllBlocksCleared), so the index holds exactly what the pod holds.
	// CompleteSinceSeq is the first seq of the unbroken run of batches the
	// sink holds; IncompleteReason says why the run does not reach back to an
	// empty cache: "joined_late" (first batch seen after seq 0 and no replay
	// endpoint), "replay_window" (the engine's replay buffer no longer holds
	// the start), "gap" (batches lost and not replayed), "restart" (the engine
	// restarted and its first batches were missed), "overflow" (a batch
	// dropped on a full queue), "message_lost" (the connection it arrives on
	// ended in the middle of a message, which may have been this stream's:
	// its next batch tells, by its sequence number), "disconnected" (the
	// connection its latest batch came through ended: the engine died, closed
	// it or was cut off; its next batch, on any connection, tells as for
	// "message_lost"; lost.go), "restored" (the state
	// was loaded from a saved index, which this process cannot vouch for,
	// and no engine snapshot has replaced it yet), "index_lost" (the index
	// backend lost entries: Redis restarted, evicted or was flushed) and
	// "index_error" (a write of the pod's failed, as the sink's ApplyOutcome
	// said, and the pod is cleared and rebuilt from later events only) and
	// "evicted_for_capacity" (the in-memory index dropped some of the pod's
	// blocks to stay within its capacity: MarkEvicted); those three last until an engine snapshot or a rebuild from the replay
	// buffer replaces the pod's state, or the engine clears or restarts its
	// cache (MarkIndexLost, trust.go, rebuild.go). Reported only, never
	// stored: "snapshot_applying" (an engine snapshot is queued or being
	// applied in turns of the worker, so the index holds part of it at
	// most) stands for a complete stream until its last turn. The names are
	// the why* constants (trust.go).
	Complete         bool
	CompleteSinceSeq uint64
	IncompleteReason string
	// Held says why the pod's entries are not served ("" when they are):
	// "restored" (loaded from a saved index, no batch of the stream applied
	// since: ResumeFrom) or "index_error" (a write of the pod's failed and
	// the pod has not been cleared since). See Servable.
	Held string
	// Epoch is SGLang's publisher lifecycle id (topic metadata, or the
	// header of an engine snapshot), if sent.
	Epoch string
	// ApplyLag is how late the index is for this stream: the age of its
	// oldest batch still waiting for its worker (0 when none waits). A
	// complete stream with a lag has every batch, but not yet in the index.
	ApplyLag time.Duration
}

type streamKey struct {
	pod  string
	rank int
}

// stream is one (pod, dp rank): its sequence state and its statistics,
// under two locks so that a snapshot never waits on the network.
type stream struct {
	key    streamKey
	worker int // fixed for life: that is what keeps its batches in order

	// order serializes a batch's way from the sequence check to its queue
	// and guards seqState and needClear. The reader holds it across a
	// replay exchange (bounded by ReplayTimeout), which keeps the replayed
	// batches ahead of the live one even if another socket delivers the
	// same stream meanwhile. Only readers (with the replay and resync they
	// run), ResumeFrom and expire (which skips a stream it finds held)
	// take it.
	order sync.Mutex
	seqState
	// vouched is the completeness a live peer vouched for with the state
	// copied from it (ResumeFromPeer), granted at the stream's first batch
	// if that batch continues the copy; guarded by order.
	vouched *completion
	// needClear: a synthetic AllBlocksCleared goes in front of the next
	// batch queued (enqueue), for the reason clearWhy.
	needClear bool
	clearWhy  string
	// peer is the connection the stream's latest batch came through, set
	// by its reader; lost.go marks the stream when that connection ends in
	// the middle of a message.
	peer string

	// mu guards stats. It is held only to copy or bump them, never across
	// I/O or a channel operation: Streams takes nothing else.
	mu    sync.Mutex
	stats StreamStats
	// backlog is what the stream holds in its worker's queue, within its
	// share (dispatcher_share.go).
	backlog streamBacklog
	// lostFrom: a message of the stream's connection was cut short
	// (markLost), so StreamStats says "message_lost" until the next batch
	// shows whether it was the stream's; it holds what the stream said
	// until then (nil: no such mark). Under mu.
	lostFrom *completion
	// indexLost: MarkIndexLost marked the stream; its next batch makes it
	// incomplete in its sequence state too (so it asks the snapshot
	// endpoint). Under mu: the marker never takes order.
	indexLost bool
	// The stream's rebuild by replay (rebuild.go), under mu: where it
	// stands and when the last one began.
	rebuildPhase rebuildPhase
	lastRebuild  time.Time
	// lostCount is the subscriber's count of streams whose reason is
	// "index_lost" (Subscriber.Rebuilding), kept by setCompletionLocked.
	lostCount *atomic.Int64
}

func (st *stream) currentStats() StreamStats {
	lag, snap := st.backlog.state(time.Now())
	st.mu.Lock()
	defer st.mu.Unlock()
	out := st.stats
	out.ApplyLag = lag
	out.Complete, out.IncompleteReason = reported(out.Complete, out.IncompleteReason, snap)
	return out
}

// reported is the completeness a stream answers with: a stream whose
// engine snapshot is still being applied is incomplete (snapshot_applying)
// although its sequence says complete, since the snapshot goes into the
// index in turns (dispatcher_workqueue.go). Any other reason stands.
func reported(complete bool, why string, snapshotQueued bool) (bool, string) {
	if complete && snapshotQueued {
		return false, whySnapshotApplying
	}
	return complete, why
}

// Streams lists every (pod, dp rank) stream seen, sorted by pod then rank.
// It never waits on a socket or a replay in progress.
func (s *Subscriber) Streams() []StreamStats {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	out := make([]StreamStats, 0, len(all))
	for _, st := range all {
		ss := st.currentStats()
		ss.Held = s.trust.get(st.key).String()
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod != out[j].Pod {
			return out[i].Pod < out[j].Pod
		}
		return out[i].DPRank < out[j].DPRank
	})
	return out
}

// StreamRef names one (pod, dp rank) stream.
type StreamRef struct {
	Pod    string
	DPRank int
}

// StreamState is the one answer about a pod's trust, from its StreamStats:
// whether its entries may be served (Held, "" when they may: Servable), how
// late the index is for it and whether it holds every batch, and why not.
// Known is false for a stream this subscriber does not track (never seen,
// forgotten, or published to another daemon sharing the index); such a pod
// is servable unless it is still held (a forgotten pod whose clear failed).
type StreamState struct {
	Known            bool
	Held             string
	ApplyLag         time.Duration
	Complete         bool
	IncompleteReason string
}

// Servable reports whether the pod's entries may be served.
func (s StreamState) Servable() bool { return s.Held == "" }

// StreamStates sets out[i] to the state of the stream refs[i] names (out
// must be as long as refs). It takes the subscriber's lock once and
// allocates nothing: the score path calls it for every answer.
func (s *Subscriber) StreamStates(refs []StreamRef, out []StreamState) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range refs {
		k := streamKey{pod: r.Pod, rank: r.DPRank}
		held := s.trust.get(k).String()
		st := s.streams[k]
		if st == nil {
			out[i] = StreamState{Held: held}
			continue
		}
		lag, snap := st.backlog.state(now)
		st.mu.Lock()
		complete, why := reported(st.stats.Complete, st.stats.IncompleteReason, snap)
		out[i] = StreamState{Known: true, Held: held, ApplyLag: lag, Complete: complete, IncompleteReason: why}
		st.mu.Unlock()
	}
}

// Streams are created by admit (limits.go), which enforces the caps.

// seqSource says where a batch comes from: the live socket, the replay
// buffer asked for at connect (catchUp), or the replay buffer asked for to
// rebuild a stream the index lost (rebuild.go).
type seqSource uint8

const (
	fromLive seqSource = iota
	fromCatchUp
	fromRebuild
)

// sequence checks b's seq against the stream, repairs or flags what it finds
// and queues b. evErrs is the number of b's events the decoder dropped;
// epoch is SGLang's publisher lifecycle id from the topic (nil if none).
//
// What b means is decided by decideSeq (sequence.go), which also gives the
// stream's new sequence state; this applies the decision. Missing batches
// are fetched from the engine's replay endpoint when it has one: after a
// forward gap, from seq 0 for a stream first seen after its start, and from
// seq 0 of the new lifetime after a restart. What cannot be fetched leaves
// the stream incomplete (StreamStats.Complete), and a snapshot endpoint is
// then asked for the pod's state. It reports whether b was queued.
//
// st.order stays held across those exchanges (bounded by ReplayTimeout):
// it is the stream's turn to queue, and giving it up would let another
// socket delivering the same stream queue a later batch ahead of the
// replayed ones. The new state is written before the exchange, so nothing
// about the decision depends on what the network does; only completeness
// waits for the replay's outcome. st.mu is never held across I/O.
func (s *Subscriber) sequence(ctx context.Context, st *stream, src *source, b *event.Batch, evErrs int,
	epoch []byte, how seqSource) bool {
	st.order.Lock()
	defer st.order.Unlock()
	st.mu.Lock()
	if st.indexLost {
		st.indexLost, st.incomplete = false, true
	}
	st.mu.Unlock()
	last := st.lastSeq
	d := decideSeq(st.seqState, seqInput{seq: b.Seq, epoch: epoch, how: how,
		replay: src.replay != "", snapshot: src.snapshot != "", clears: hasClear(b), first: src.firstSeq})
	if d.drop != "" {
		s.drop(d.drop)
		if d.warn {
			s.warn(src.addr+"|"+b.Pod, "dropping KV event batch: sequence number does not advance", "pod", b.Pod,
				"dp_rank", b.DPRank, "last_seq", last, "seq", b.Seq, "reason", d.drop)
		}
		return false
	}
	st.seqState = d.next
	if d.clear {
		st.needClear, st.clearWhy = true, whyRestart
		if s.trust.get(st.key) == holdRestored {
			// The engine restarted since the saved state was taken.
			st.clearWhy = whyRestored
		}
	}

	st.mu.Lock()
	// The endpoint a stream's latest batch came through is the one whose
	// removal clears it (RemoveEndpoint).
	st.stats.Endpoint, st.stats.Engine, st.stats.Model, st.stats.Role = src.addr, src.engine, b.Model, src.role
	st.peer = src.peer
	st.stats.DecodeErrors += uint64(evErrs)
	st.stats.Epoch = st.epoch
	counted := min(d.missed, maxCountedMissed)
	if d.kind == seqGap {
		st.stats.SeqGaps++
		st.stats.MissedBatches += counted
	}
	st.stats.Replaying = d.replay
	if d.kind == seqRestart {
		st.stats.Restarts++
	}
	st.mu.Unlock()

	switch d.kind {
	case seqRestart:
		s.metrics.Restarts.Inc()
		s.warn(src.addr+"|"+b.Pod, "engine restart detected (sequence went back to a low value or a new epoch): clearing pod", "pod", b.Pod,
			"dp_rank", b.DPRank, "last_seq", last, "seq", b.Seq, "epoch", st.epoch)
	case seqGap:
		s.metrics.SeqGaps.Inc()
		s.metrics.MissedBatches.Add(float64(counted))
		s.warn(src.addr+"|"+b.Pod, "KV event sequence gap: batches lost", "pod", b.Pod, "dp_rank", b.DPRank,
			"last_seq", last, "seq", b.Seq, "missed", d.missed, "replay", d.replay)
	case seqJoin:
		s.log.Info("joined a stream after its start", "pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq, "catch_up", d.replay)
	}

	var r replayResult
	if d.replay {
		r.run, r.filled = s.replay(ctx, st, src, b.Model, d.from, b.Seq)
		if ctx.Err() != nil {
			// The endpoint is being removed (its clear follows and the
			// stream is forgotten) or the subscriber is stopping: the
			// live batch goes with the replay.
			return false
		}
	}
	c := d.completeness(r)
	if v := st.vouched; v != nil {
		st.vouched = nil
		// In order after the copy, or its gap replayed: the copy and the
		// batches since are the peer's unbroken run, so the stream is as
		// complete as the peer's was. A restart, a clear or a gap not
		// replayed decides as it would anyway.
		if !c.set && !d.clear && (d.kind == seqNext || d.kind == seqGap) {
			c = completeness{set: true, since: v.since}
		}
	}
	if c.set {
		st.setComplete(c.since, c.why)
	} else {
		st.lostResolved()
	}
	st.incomplete = c.incomplete
	st.mu.Lock()
	st.stats.LastSeq = b.Seq
	st.stats.Batches++
	st.mu.Unlock()
	s.enqueue(st, b)
	if c.resync {
		// b first: the snapshot is cut after it (its barrier is the next
		// seq the engine assigns), and on a pod whose hashes mismatch ours
		// its token ids give the aliases the snapshot's hashes are indexed
		// under.
		if s.resync(ctx, st, src, b.Model) {
			st.incomplete, st.snapFailed = false, false
		} else {
			st.snapFailed, st.snapRetry = true, st.lastSeq+snapshotRetryBatches
		}
	}
	return true
}

// setComplete records how far back the sink's view of the stream is
// unbroken; why == "" means back to an empty cache.
func (st *stream) setComplete(since uint64, why string) {
	st.mu.Lock()
	st.setCompletionLocked(completion{since: since, why: why})
	if why == "" {
		st.indexLost = false
	}
	st.mu.Unlock()
}

// hasClear reports whether the engine itself cleared its cache in b.
func hasClear(b *event.Batch) bool {
	for i := range b.Events {
		if b.Events[i].Kind == event.AllBlocksCleared {
			return true
		}
	}
	return false
}

// enqueue hands b to its worker, waiting a bounded time on a full queue
// (dispatcher_backpressure.go). If the queue stays full the batch is dropped and the
// stream marked: a synthetic AllBlocksCleared goes in front of its next
// queued batch, because the sink has now missed events and its state for
// the pod is no longer complete.
// st.order is held.
func (s *Subscriber) enqueue(st *stream, b *event.Batch) {
	if st.needClear {
		ev := make([]event.Event, 0, len(b.Events)+1)
		ev = append(ev, event.Event{Kind: event.AllBlocksCleared})
		b.Events = append(ev, b.Events...)
	}
	if s.dispatcher.queueBounded(st.worker, &st.backlog, b) {
		if st.needClear {
			s.metrics.SyntheticClears.WithLabelValues(st.clearWhy).Inc()
			if st.clearWhy == whyRestored {
				s.trust.restoreClears.Add(1)
			}
			st.needClear = false
		}
		return
	}
	st.mu.Lock()
	st.stats.Overflows++
	st.mu.Unlock()
	s.metrics.QueueOverflows.Inc()
	if !st.needClear || st.clearWhy != whyOverflow {
		s.log.Warn("worker queue full: dropping batch; pod will be cleared before its next batch",
			"pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq)
	}
	st.needClear, st.clearWhy = true, whyOverflow
	st.mu.Lock()
	// The clear that follows empties the index, not the pod's cache.
	st.setCompletionLocked(completion{since: b.Seq + 1, why: whyOverflow})
	st.mu.Unlock()
}
