package kvevents

// The sequence decision: what an arriving batch means for its stream, as a
// pure function of the stream's state and what is known of the batch, so
// that every case is a row of a table test (sequence_test.go) and
// Subscriber.sequence is left with the effects: statistics, logs, the
// replay and snapshot exchanges, queuing.

// maxCountedMissed bounds what one forward jump adds to MissedBatches (the
// stream's and kvindexd_kvevents_missed_batches_total): a jump of 2^64-2 is
// a peer's claim, not batches an engine published, and would swamp the
// counter for good. No engine publishes 2^24 batches between two that reach
// us; the log line still says how far the sequence jumped.
const maxCountedMissed = 1 << 24

// seqState is the part of a stream the decision reads and replaces. It is
// embedded in stream (guarded by stream.order), so its fields read as the
// stream's own.
type seqState struct {
	hasSeq  bool // a batch was accepted, or ResumeFrom set lastSeq
	lastSeq uint64
	epoch   string // SGLang's publisher lifecycle id, "" if none seen
	// dedup: batches from dedupFrom up to lastSeq came through catch-up
	// (or a snapshot covers them); their live copies are dropped until a
	// newer live batch arrives.
	dedup     bool
	dedupFrom uint64
	// incomplete: the sink's view of the stream does not reach back to an
	// empty cache (StreamStats.Complete is false), or cannot be vouched for
	// (a stream resumed from a restored snapshot). Such a stream asks the
	// snapshot endpoint, when it has one, at every accepted batch...
	incomplete bool
	// ...except after a failed snapshot exchange: not again before seq
	// snapRetry (the engine busy, or down: no exchange per batch).
	snapFailed bool
	snapRetry  uint64
	// rebuild follows a rebuild by replay under way (rebuild.go).
	rebuild rebuildState
}

// rebuildState follows a rebuild: the stream's state in the index, lost
// behind the subscriber (MarkIndexLost), is replaced by the engine's replay
// buffer from the start of the publisher lifetime (seq 0) up to the last
// batch seen live when it began. Only the rebuilt run proves anything: the
// replay's end marker or its batches past that point do not.
type rebuildState struct {
	on bool   // a rebuild is under way
	to uint64 // the last seq seen live when it began: it ends there
	// ran: a batch was rebuilt, next is the seq after the last one, and
	// since the first of the unbroken run of rebuilt batches ending there.
	ran   bool
	next  uint64
	since uint64
	// clean: that run starts with an empty cache: at seq 0, the first of
	// the lifetime, or at a batch holding the engine's AllBlocksCleared.
	clean bool
}

// snapshotRetryBatches is how many batches a stream waits after a failed
// snapshot exchange before it asks again.
const snapshotRetryBatches = 64

// seqInput is what is known of an arriving batch before any I/O.
type seqInput struct {
	seq   uint64
	epoch []byte // from the topic; nil if it carries none
	how   seqSource
	// replay and snapshot: the endpoint has a replay (snapshot) address
	// (ignored for a rebuilt batch).
	replay, snapshot bool
	// clears: the batch holds the engine's own AllBlocksCleared.
	clears bool
	// first is the seq the publisher starts at (0, or 1 for llm-d's).
	first uint64
}

// seqKind is what a batch is to its stream.
type seqKind uint8

const (
	// Dropped, the state unchanged.
	seqDuplicate seqKind = iota // live, same seq as the last one
	seqStale                    // live, back to a high seq: from the past, not a restart
	seqCopy                     // already delivered by catch-up (or a snapshot)
	// Accepted.
	seqNext    // follows the last batch
	seqFirst   // the stream's first batch, at seq 0: nothing missed
	seqJoin    // the stream's first batch, after seq 0: its start missed
	seqGap     // a forward jump: the batches between were missed
	seqRestart // a new publisher lifetime (a jump back to a low seq, or a new epoch)
	seqRebuilt // a rebuild's batch: queued, the stream's last seq unchanged
	// A rebuild's batch dropped, the state unchanged.
	seqAhead // after the last seq seen live: the live socket delivers it
	seqAlien // not of the rebuild: none under way, or another lifetime's
)

var seqKindNames = [...]string{"duplicate", "stale", "copy", "next", "first", "join", "gap", "restart", "rebuilt", "ahead", "alien"}

func (k seqKind) String() string { return seqKindNames[k] }

// seqDecision is the fate of one batch.
type seqDecision struct {
	kind seqKind
	// drop is the dropped-frame reason for the kinds that drop the batch
	// ("" = queued); warn: the drop deserves a log line (a catch-up copy
	// is expected and does not).
	drop string
	warn bool
	// missed batches [from, seq) precede this one in its lifetime.
	missed, from, seq uint64
	replay            bool // fetch them from the replay endpoint before queuing
	clear             bool // the pod's state must be cleared before this batch
	// why the stream is incomplete if what was missed is not recovered
	// ("" when nothing was missed).
	why      string
	newEpoch bool // the topic carried an epoch other than the stream's
	clears   bool // the batch clears the engine's cache itself
	// canResync: an incomplete stream may be repaired by a snapshot (the
	// endpoint has a snapshot address and no failed exchange holds it back).
	canResync bool
	// wasIncomplete: the stream was incomplete before this batch.
	wasIncomplete bool
	next          seqState
}

// decideSeq decides what batch in means for a stream in state cur.
//
// The numbers of a publisher lifetime are 0, 1, 2, ...; only a live batch
// is held to that order: a jump back to a low value (seqVerdict) is a
// restart, an equal or slightly lower one a duplicate or a stale batch.
// Catch-up batches and live copies of what catch-up (or a snapshot) already
// delivered (cur.dedup) are dropped when not newer than the last. Forward
// jumps are gaps, replayed when live and the endpoint has a replay address;
// a new epoch is a new lifetime whatever its seq. The last seq never
// wraps: after 2^64-1 every number is a jump back.
//
// A stream left incomplete (what was missed could not be replayed, or a
// restored state this process cannot vouch for) asks the snapshot endpoint,
// when there is one, whether the batch came live or through catch-up: at
// connect, after a gap and after a daemon restart alike.
//
// A batch of a rebuild (fromRebuild) is decided by decideRebuild.
func decideSeq(cur seqState, in seqInput) seqDecision {
	if in.how == fromRebuild {
		return decideRebuild(cur, in)
	}
	d := seqDecision{seq: in.seq, clears: in.clears, next: cur, wasIncomplete: cur.incomplete}
	d.newEpoch = in.epoch != nil && string(in.epoch) != cur.epoch
	last := cur.lastSeq
	copyOf := cur.dedup && in.seq >= cur.dedupFrom
	if cur.hasSeq && !d.newEpoch {
		if in.how == fromLive && !copyOf {
			switch seqVerdict(last, in.seq) {
			case "duplicate_seq":
				d.kind, d.drop, d.warn = seqDuplicate, "duplicate_seq", true
				return d
			case "stale_seq":
				d.kind, d.drop, d.warn = seqStale, "stale_seq", true
				return d
			}
		}
		// Live batches published between our subscription and the
		// catch-up reply arrive twice; catch-up ignores what we hold.
		if in.seq <= last && (in.how == fromCatchUp || copyOf) {
			d.kind, d.drop = seqCopy, "duplicate"
			return d
		}
	}

	switch {
	case cur.hasSeq && d.newEpoch && cur.epoch != "":
		// Another publisher lifetime: its cache started empty whatever
		// its seq says.
		d.kind, d.missed = seqRestart, in.seq
	case cur.hasSeq && in.seq > last && in.seq-last == 1:
		d.kind = seqNext
	case cur.hasSeq && in.seq > last:
		d.kind, d.missed, d.from = seqGap, in.seq-last-1, last+1
	case cur.hasSeq:
		d.kind, d.missed = seqRestart, in.seq
	case in.seq == in.first:
		d.kind = seqFirst
	default:
		// Missed: the batches from the publisher's first seq to this one.
		d.kind, d.missed = seqJoin, in.seq-min(in.seq, in.first)
	}
	d.clear = d.kind == seqRestart
	d.replay = d.missed > 0 && in.replay && in.how == fromLive
	d.canResync = in.snapshot && !(cur.snapFailed && in.seq < cur.snapRetry)
	switch {
	case d.missed == 0:
	case d.kind == seqRestart:
		d.why = whyRestart
	case in.how == fromCatchUp:
		d.why = whyReplayWindow // what catch-up asked for is no longer buffered
	case d.kind == seqGap:
		d.why = whyGap
	default:
		d.why = whyJoinedLate
	}

	if d.newEpoch {
		d.next.epoch = string(in.epoch)
	}
	d.next.hasSeq, d.next.lastSeq = true, in.seq
	switch {
	case in.how == fromLive:
		d.next.dedup, d.next.dedupFrom = false, 0
	case !cur.dedup:
		// Until a newer live batch arrives, live batches up to this one
		// are the copies catch-up already delivered.
		d.next.dedup, d.next.dedupFrom = true, in.seq
	}
	return d
}

// replayResult is what a replay exchange achieved (Subscriber.replay):
// every batch up to the gap's end was queued (filled), in one unbroken run
// starting at run.
type replayResult struct {
	run    uint64
	filled bool
}

// completeness is what an accepted batch does to the stream's completeness
// (StreamStats.Complete): set it to (since, why), why "" meaning complete;
// incomplete: the stream's state once the batch is queued; resync: it is
// incomplete and may ask the snapshot endpoint.
type completeness struct {
	set        bool // else unchanged
	since      uint64
	why        string
	incomplete bool
	resync     bool
}

// completeness says where the stream stands once the batch is queued, given
// what the replay achieved (ignored when there was none).
func (d *seqDecision) completeness(r replayResult) completeness {
	var c completeness
	switch {
	case d.kind == seqNext:
		// in order: unchanged
	case d.missed == 0:
		c = completeness{set: true} // a lifetime seen from its start
	case !d.replay, !r.filled:
		c = completeness{set: true, since: d.seq, why: d.why}
	case r.run > d.from:
		c = completeness{set: true, since: r.run, why: whyReplayWindow}
	case d.kind == seqGap:
		// repaired: unchanged
	default:
		c = completeness{set: true} // the whole lifetime replayed
	}
	if d.clears {
		// The engine emptied its cache: whatever was missed is gone.
		return completeness{set: true, since: d.seq}
	}
	if c.set {
		c.incomplete = c.why != ""
	} else {
		c.incomplete = d.wasIncomplete
	}
	c.resync = c.incomplete && d.canResync
	return c
}

// decideRebuild decides a batch of a rebuild's replay (fromRebuild). Its seq
// is at or below the last one seen live, which a live or catch-up batch
// would be dropped for: here it is queued, and only the rebuilt run
// advances (the stream's last seq, dedup window and completeness stay). The
// first one is queued behind a clear of the pod (clear), which removes what
// the index kept or got from later batches: after it the pod holds exactly
// what the rebuilt batches store. Below the run's next seq a batch is a
// copy; a batch of another epoch (an engine restarted since) belongs to no
// rebuild; a hole in the replay starts the run again, not clean.
//
// Past the last seq seen live, a batch that continues the run is queued as
// catch-up would queue it (the last seq moves, and its live copy is
// dropped): the engine published it before it answered, and an idle pod's
// last batch lost on the way would otherwise be missing from a rebuild
// that says complete. Any other is left to the live socket (ahead).
func decideRebuild(cur seqState, in seqInput) seqDecision {
	d := seqDecision{seq: in.seq, clears: in.clears, next: cur, wasIncomplete: cur.incomplete}
	rb := cur.rebuild
	switch {
	case !rb.on || in.epoch != nil && string(in.epoch) != cur.epoch:
		d.kind, d.drop = seqAlien, "rebuild_alien"
		return d
	case in.seq > rb.to && !(rb.ran && in.seq == rb.next):
		d.kind, d.drop = seqAhead, "rebuild_ahead"
		return d
	case rb.ran && in.seq < rb.next:
		d.kind, d.drop = seqCopy, "duplicate"
		return d
	}
	d.kind = seqRebuilt
	switch {
	case !rb.ran:
		d.clear = true
		rb.since, rb.clean = in.seq, in.seq == 0
	case in.seq != rb.next:
		rb.since, rb.clean = in.seq, false
	}
	if in.clears {
		rb.since, rb.clean = in.seq, true
	}
	rb.ran, rb.next = true, in.seq+1
	d.next.rebuild = rb
	if in.seq > rb.to {
		d.next.lastSeq = in.seq
		if !cur.dedup {
			d.next.dedup, d.next.dedupFrom = true, in.seq
		}
	}
	return d
}

// rebuildOutcome is what a finished rebuild proves: complete when its run
// starts at an empty cache and reaches the last seq seen live; only the
// start missing (the engine's buffer wrapped) when the run reaches it from a
// later batch: the pod is complete since then ("replay_window"); nothing
// when it does not reach it (the exchange failed, timed out, skipped a
// batch, or a batch was not queued: aborted), and the stream keeps the
// reason it had.
func rebuildOutcome(rb rebuildState, aborted bool) (set bool, since uint64, why string) {
	switch {
	case aborted || !rb.ran || rb.next-1 < rb.to:
		return false, 0, ""
	case rb.clean:
		return true, rb.since, ""
	default:
		return true, rb.since, whyReplayWindow
	}
}
