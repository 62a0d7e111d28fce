package kvevents

import (
	"context"
	"math"
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// Every branch of decideSeq and of seqDecision.completeness: each row is a
// stream's state, an arriving batch (and what a replay achieved, when one is
// decided), and the whole decision and completeness expected.
func TestDecideSeq(t *testing.T) {
	const top = math.MaxUint64
	at := func(last uint64) seqState { return seqState{hasSeq: true, lastSeq: last} }
	inEpoch := func(last uint64, epoch string) seqState {
		return seqState{hasSeq: true, lastSeq: last, epoch: epoch}
	}
	deduped := func(from, last uint64) seqState {
		return seqState{hasSeq: true, lastSeq: last, dedup: true, dedupFrom: from}
	}
	live := func(seq uint64) seqInput { return seqInput{seq: seq, how: fromLive} }
	liveR := func(seq uint64) seqInput { return seqInput{seq: seq, how: fromLive, replay: true} }
	liveS := func(seq uint64) seqInput { return seqInput{seq: seq, how: fromLive, snapshot: true} }
	liveRS := func(seq uint64) seqInput { return seqInput{seq: seq, how: fromLive, replay: true, snapshot: true} }
	liveE := func(seq uint64, epoch string) seqInput {
		return seqInput{seq: seq, how: fromLive, epoch: []byte(epoch)}
	}
	caught := func(seq uint64) seqInput {
		return seqInput{seq: seq, how: fromCatchUp, replay: true, snapshot: true}
	}
	complete := completeness{set: true}
	lost := func(since uint64, why string) completeness {
		return completeness{set: true, since: since, why: why, incomplete: true}
	}
	resync := func(since uint64, why string) completeness {
		return completeness{set: true, since: since, why: why, incomplete: true, resync: true}
	}
	incomplete := func(last uint64) seqState { return seqState{hasSeq: true, lastSeq: last, incomplete: true} }
	// stillIncomplete: unchanged completeness of an incomplete stream.
	stillIncomplete := completeness{incomplete: true}
	// rebuilding: a rebuild under way of a stream last seen at seq to;
	// rb's on and to are filled in.
	rebuilding := func(to uint64, rb rebuildState) seqState {
		rb.on, rb.to = true, to
		return seqState{hasSeq: true, lastSeq: to, rebuild: rb}
	}
	rebuilt := func(seq uint64) seqInput { return seqInput{seq: seq, how: fromRebuild} }

	for _, tc := range []struct {
		name  string
		cur   seqState
		in    seqInput
		res   replayResult // what the replay achieved, if want.replay
		want  seqDecision
		wantC completeness
	}{
		// The first batch of a stream.
		{name: "first at 0", in: live(0),
			want:  seqDecision{kind: seqFirst, next: at(0)},
			wantC: complete},
		{name: "first at 0 with an epoch", in: liveE(0, "a"),
			want:  seqDecision{kind: seqFirst, newEpoch: true, next: inEpoch(0, "a")},
			wantC: complete},
		// Issue 32: llm-d's publishers count from 1 (--bind-first-seq 1);
		// for the engines, which count from 0, a first 1 is a late join.
		{name: "first at 1 from a publisher counting from 1", in: seqInput{seq: 1, how: fromLive, first: 1},
			want:  seqDecision{kind: seqFirst, seq: 1, next: at(1)},
			wantC: complete},
		{name: "first at 1 from an engine counting from 0", in: live(1),
			want:  seqDecision{kind: seqJoin, seq: 1, missed: 1, why: "joined_late", next: at(1)},
			wantC: lost(1, "joined_late")},
		{name: "first at 2 from a publisher counting from 1", in: seqInput{seq: 2, how: fromLive, first: 1},
			want:  seqDecision{kind: seqJoin, seq: 2, missed: 1, why: "joined_late", next: at(2)},
			wantC: lost(2, "joined_late")},
		{name: "joined late, no replay", in: live(7),
			want:  seqDecision{kind: seqJoin, seq: 7, missed: 7, why: "joined_late", next: at(7)},
			wantC: lost(7, "joined_late")},
		{name: "joined late, snapshot asked", in: liveS(7),
			want:  seqDecision{kind: seqJoin, seq: 7, missed: 7, why: "joined_late", canResync: true, next: at(7)},
			wantC: resync(7, "joined_late")},
		{name: "joined late, whole start replayed", in: liveR(7), res: replayResult{run: 0, filled: true},
			want:  seqDecision{kind: seqJoin, seq: 7, missed: 7, replay: true, why: "joined_late", next: at(7)},
			wantC: complete},
		{name: "joined late, start no longer buffered", in: liveRS(7), res: replayResult{run: 3, filled: true},
			want:  seqDecision{kind: seqJoin, seq: 7, missed: 7, replay: true, why: "joined_late", canResync: true, next: at(7)},
			wantC: resync(3, "replay_window")},
		{name: "joined late, replay failed", in: liveR(7), res: replayResult{run: 0, filled: false},
			want:  seqDecision{kind: seqJoin, seq: 7, missed: 7, replay: true, why: "joined_late", next: at(7)},
			wantC: lost(7, "joined_late")},
		// A daemon joining after the replay window: the loss found by
		// catch-up asks for a snapshot (issue 25: it did not).
		{name: "first catch-up batch after the buffer's start", in: caught(4),
			want:  seqDecision{kind: seqJoin, seq: 4, missed: 4, why: "replay_window", canResync: true, next: deduped(4, 4)},
			wantC: resync(4, "replay_window")},
		{name: "first catch-up batch after the buffer's start, no snapshot address",
			in:    seqInput{seq: 4, how: fromCatchUp, replay: true},
			want:  seqDecision{kind: seqJoin, seq: 4, missed: 4, why: "replay_window", next: deduped(4, 4)},
			wantC: lost(4, "replay_window")},
		{name: "first catch-up batch at 0", in: caught(0),
			want:  seqDecision{kind: seqFirst, canResync: true, next: deduped(0, 0)},
			wantC: complete},

		// An incomplete stream asks at every accepted batch, live or
		// caught up (a stream resumed from a restored index, a snapshot
		// that failed earlier), unless a failed exchange holds it back.
		{name: "incomplete, in order, snapshot address", cur: incomplete(5), in: liveS(6),
			want:  seqDecision{kind: seqNext, seq: 6, canResync: true, wasIncomplete: true, next: incomplete(6)},
			wantC: completeness{incomplete: true, resync: true}},
		{name: "incomplete, in order through catch-up (restored, then reconnected)", cur: incomplete(5), in: caught(6),
			want: seqDecision{kind: seqNext, seq: 6, canResync: true, wasIncomplete: true,
				next: seqState{hasSeq: true, lastSeq: 6, incomplete: true, dedup: true, dedupFrom: 6}},
			wantC: completeness{incomplete: true, resync: true}},
		{name: "incomplete, in order, no snapshot address", cur: incomplete(5), in: live(6),
			want:  seqDecision{kind: seqNext, seq: 6, wasIncomplete: true, next: incomplete(6)},
			wantC: stillIncomplete},
		{name: "incomplete, snapshot failed recently", cur: seqState{hasSeq: true, lastSeq: 5, incomplete: true, snapFailed: true, snapRetry: 69},
			in:    liveS(6),
			want:  seqDecision{kind: seqNext, seq: 6, wasIncomplete: true, next: seqState{hasSeq: true, lastSeq: 6, incomplete: true, snapFailed: true, snapRetry: 69}},
			wantC: stillIncomplete},
		{name: "incomplete, retry point reached", cur: seqState{hasSeq: true, lastSeq: 68, incomplete: true, snapFailed: true, snapRetry: 69},
			in:    liveS(69),
			want:  seqDecision{kind: seqNext, seq: 69, canResync: true, wasIncomplete: true, next: seqState{hasSeq: true, lastSeq: 69, incomplete: true, snapFailed: true, snapRetry: 69}},
			wantC: completeness{incomplete: true, resync: true}},
		{name: "incomplete, the engine clears its cache", cur: incomplete(5), in: seqInput{seq: 6, how: fromLive, snapshot: true, clears: true},
			want:  seqDecision{kind: seqNext, seq: 6, clears: true, canResync: true, wasIncomplete: true, next: incomplete(6)},
			wantC: completeness{set: true, since: 6}},
		{name: "incomplete, a gap wholly replayed leaves it incomplete", cur: incomplete(1), in: liveRS(5), res: replayResult{run: 2, filled: true},
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, replay: true, why: "gap", canResync: true, wasIncomplete: true, next: incomplete(5)},
			wantC: completeness{incomplete: true, resync: true}},

		// In order, duplicates, batches from the past.
		{name: "in order", cur: at(5), in: liveRS(6),
			want:  seqDecision{kind: seqNext, seq: 6, canResync: true, next: at(6)},
			wantC: completeness{}},
		{name: "same seq again", cur: at(5), in: live(5),
			want: seqDecision{kind: seqDuplicate, drop: "duplicate_seq", warn: true, seq: 5, next: at(5)}},
		{name: "seq 0 twice", cur: at(0), in: live(0),
			want: seqDecision{kind: seqDuplicate, drop: "duplicate_seq", warn: true, next: at(0)}},
		{name: "from the past", cur: at(1000), in: live(900),
			want: seqDecision{kind: seqStale, drop: "stale_seq", warn: true, seq: 900, next: at(1000)}},
		{name: "just below the last", cur: at(1000), in: live(999),
			want: seqDecision{kind: seqStale, drop: "stale_seq", warn: true, seq: 999, next: at(1000)}},

		// Forward gaps.
		{name: "gap, no replay", cur: at(1), in: live(5),
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, why: "gap", next: at(5)},
			wantC: lost(5, "gap")},
		{name: "gap, no replay, snapshot asked", cur: at(1), in: liveS(5),
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, why: "gap", canResync: true, next: at(5)},
			wantC: resync(5, "gap")},
		{name: "gap replayed", cur: at(1), in: liveRS(5), res: replayResult{run: 2, filled: true},
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, replay: true, why: "gap", canResync: true, next: at(5)},
			wantC: completeness{}},
		{name: "gap partly beyond the replay buffer", cur: at(1), in: liveR(5), res: replayResult{run: 4, filled: true},
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, replay: true, why: "gap", next: at(5)},
			wantC: lost(4, "replay_window")},
		{name: "gap, replay failed", cur: at(1), in: liveRS(5), res: replayResult{run: 2, filled: false},
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, replay: true, why: "gap", canResync: true, next: at(5)},
			wantC: resync(5, "gap")},
		{name: "gap in catch-up: not replayed again, a snapshot asked", cur: at(1), in: caught(5),
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, why: "replay_window", canResync: true, next: deduped(5, 5)},
			wantC: resync(5, "replay_window")},
		{name: "gap whose batch clears the cache", cur: at(1), in: seqInput{seq: 5, how: fromLive, snapshot: true, clears: true},
			want:  seqDecision{kind: seqGap, seq: 5, missed: 3, from: 2, why: "gap", clears: true, canResync: true, next: at(5)},
			wantC: completeness{set: true, since: 5}},
		{name: "resumed from a restored snapshot, then a gap", cur: at(10), in: liveR(14), res: replayResult{run: 11, filled: true},
			want:  seqDecision{kind: seqGap, seq: 14, missed: 3, from: 11, replay: true, why: "gap", next: at(14)},
			wantC: completeness{}},

		// Engine restarts.
		{name: "restart to 0", cur: at(5), in: live(0),
			want:  seqDecision{kind: seqRestart, clear: true, next: at(0)},
			wantC: complete},
		{name: "restart below 16", cur: at(1000), in: live(3),
			want:  seqDecision{kind: seqRestart, seq: 3, missed: 3, clear: true, why: "restart", next: at(3)},
			wantC: lost(3, "restart")},
		{name: "restart below half the last", cur: at(1000), in: liveS(499),
			want:  seqDecision{kind: seqRestart, seq: 499, missed: 499, clear: true, why: "restart", canResync: true, next: at(499)},
			wantC: resync(499, "restart")},
		{name: "restart, new lifetime replayed", cur: at(1000), in: liveR(3), res: replayResult{run: 0, filled: true},
			want:  seqDecision{kind: seqRestart, seq: 3, missed: 3, replay: true, clear: true, why: "restart", next: at(3)},
			wantC: complete},
		{name: "restart slightly back from a low seq", cur: at(5), in: live(4),
			want:  seqDecision{kind: seqRestart, seq: 4, missed: 4, clear: true, why: "restart", next: at(4)},
			wantC: lost(4, "restart")},
		{name: "catch-up below the last, even low: a copy, not a restart", cur: at(1000), in: caught(3),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 3, next: at(1000)}},
		{name: "restart seen by catch-up: a new epoch", cur: inEpoch(1000, "a"),
			in:    seqInput{seq: 3, how: fromCatchUp, epoch: []byte("b"), replay: true},
			want:  seqDecision{kind: seqRestart, seq: 3, missed: 3, clear: true, why: "restart", newEpoch: true, next: seqState{hasSeq: true, lastSeq: 3, epoch: "b", dedup: true, dedupFrom: 3}},
			wantC: lost(3, "restart")},
		{name: "restart after resuming from a restored snapshot", cur: at(10), in: live(0),
			want:  seqDecision{kind: seqRestart, clear: true, next: at(0)},
			wantC: complete},

		// The last seq does not wrap: after 2^64-1 a small seq is a restart.
		{name: "2^64-1 then a small seq", cur: at(top), in: liveR(3), res: replayResult{run: 0, filled: true},
			want:  seqDecision{kind: seqRestart, seq: 3, missed: 3, replay: true, clear: true, why: "restart", next: at(3)},
			wantC: complete},
		{name: "2^64-1 then 0", cur: at(top), in: live(0),
			want:  seqDecision{kind: seqRestart, clear: true, next: at(0)},
			wantC: complete},
		{name: "2^64-1 then 2^64-2", cur: at(top), in: live(top - 1),
			want: seqDecision{kind: seqStale, drop: "stale_seq", warn: true, seq: top - 1, next: at(top)}},
		{name: "2^64-2 then 2^64-1", cur: at(top - 1), in: live(top),
			want:  seqDecision{kind: seqNext, seq: top, next: at(top)},
			wantC: completeness{}},

		// SGLang epochs.
		{name: "new epoch: a restart whatever the seq", cur: inEpoch(1, "a"), in: liveE(2, "b"),
			want:  seqDecision{kind: seqRestart, seq: 2, missed: 2, clear: true, why: "restart", newEpoch: true, next: inEpoch(2, "b")},
			wantC: lost(2, "restart")},
		{name: "new epoch at the last seq: not a duplicate", cur: inEpoch(5, "a"), in: liveE(5, "b"),
			want:  seqDecision{kind: seqRestart, seq: 5, missed: 5, clear: true, why: "restart", newEpoch: true, next: inEpoch(5, "b")},
			wantC: lost(5, "restart")},
		{name: "first epoch on a stream that had none", cur: at(1), in: liveE(2, "a"),
			want:  seqDecision{kind: seqNext, seq: 2, newEpoch: true, next: inEpoch(2, "a")},
			wantC: completeness{}},
		{name: "same epoch", cur: inEpoch(1, "a"), in: liveE(1, "a"),
			want: seqDecision{kind: seqDuplicate, drop: "duplicate_seq", warn: true, seq: 1, next: inEpoch(1, "a")}},
		{name: "no epoch in the topic keeps the stream's", cur: inEpoch(1, "a"), in: live(2),
			want:  seqDecision{kind: seqNext, seq: 2, next: inEpoch(2, "a")},
			wantC: completeness{}},
		{name: "empty epoch on a stream without one", cur: at(1), in: liveE(2, ""),
			want:  seqDecision{kind: seqNext, seq: 2, next: at(2)},
			wantC: completeness{}},

		// Copies of what catch-up (or a snapshot) delivered.
		{name: "catch-up batch we hold", cur: at(5), in: caught(5),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 5, next: at(5)}},
		{name: "older catch-up batch", cur: at(5), in: caught(3),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 3, next: at(5)}},
		{name: "live copy of the last catch-up batch", cur: deduped(5, 6), in: live(6),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 6, next: deduped(5, 6)}},
		{name: "live copy of the first catch-up batch", cur: deduped(5, 6), in: live(5),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 5, next: deduped(5, 6)}},
		{name: "live batch before the catch-up window", cur: deduped(500, 600), in: live(400),
			want: seqDecision{kind: seqStale, drop: "stale_seq", warn: true, seq: 400, next: deduped(500, 600)}},
		{name: "live batch after the catch-up window ends it", cur: deduped(5, 6), in: live(7),
			want:  seqDecision{kind: seqNext, seq: 7, next: at(7)},
			wantC: completeness{}},
		{name: "catch-up batch extends the window", cur: deduped(5, 6), in: caught(7),
			want:  seqDecision{kind: seqNext, seq: 7, canResync: true, next: deduped(5, 7)},
			wantC: completeness{}},
		{name: "catch-up after live batches opens a window", cur: at(6), in: caught(7),
			want:  seqDecision{kind: seqNext, seq: 7, canResync: true, next: deduped(7, 7)},
			wantC: completeness{}},
		{name: "new epoch ends a window", cur: seqState{hasSeq: true, lastSeq: 6, epoch: "a", dedup: true, dedupFrom: 5},
			in:    liveE(0, "b"),
			want:  seqDecision{kind: seqRestart, clear: true, newEpoch: true, next: inEpoch(0, "b")},
			wantC: complete},

		// Rebuilding a stream the index lost (from the replay buffer, from
		// seq 0, up to the last seq seen live: rb.to). The stream's last
		// seq and completeness stay; only the rebuilt run advances.
		{name: "rebuild: first batch at 0, behind a clear", cur: rebuilding(5, rebuildState{}), in: rebuilt(0),
			want: seqDecision{kind: seqRebuilt, clear: true,
				next: rebuilding(5, rebuildState{ran: true, next: 1, since: 0, clean: true})}},
		{name: "rebuild: in order below the last seq", cur: rebuilding(5, rebuildState{ran: true, next: 3, clean: true}), in: rebuilt(3),
			want: seqDecision{kind: seqRebuilt, seq: 3,
				next: rebuilding(5, rebuildState{ran: true, next: 4, clean: true})}},
		{name: "rebuild: of an incomplete stream", cur: seqState{hasSeq: true, lastSeq: 5, incomplete: true, rebuild: rebuildState{on: true, to: 5}},
			in: rebuilt(0),
			want: seqDecision{kind: seqRebuilt, clear: true, wasIncomplete: true,
				next: seqState{hasSeq: true, lastSeq: 5, incomplete: true, rebuild: rebuildState{on: true, to: 5, ran: true, next: 1, clean: true}}}},
		{name: "rebuild: the buffer wrapped, first batch after 0", cur: rebuilding(5, rebuildState{}), in: rebuilt(3),
			want: seqDecision{kind: seqRebuilt, seq: 3, clear: true,
				next: rebuilding(5, rebuildState{ran: true, next: 4, since: 3})}},
		{name: "rebuild: wrapped, but the first batch clears the cache", cur: rebuilding(5, rebuildState{}),
			in: seqInput{seq: 3, how: fromRebuild, clears: true},
			want: seqDecision{kind: seqRebuilt, seq: 3, clear: true, clears: true,
				next: rebuilding(5, rebuildState{ran: true, next: 4, since: 3, clean: true})}},
		{name: "rebuild: a hole breaks the run", cur: rebuilding(9, rebuildState{ran: true, next: 3, clean: true}), in: rebuilt(5),
			want: seqDecision{kind: seqRebuilt, seq: 5,
				next: rebuilding(9, rebuildState{ran: true, next: 6, since: 5})}},
		{name: "rebuild: the engine's clear after a hole starts a clean run", cur: rebuilding(9, rebuildState{ran: true, next: 6, since: 5}),
			in: seqInput{seq: 8, how: fromRebuild, clears: true},
			want: seqDecision{kind: seqRebuilt, seq: 8, clears: true,
				next: rebuilding(9, rebuildState{ran: true, next: 9, since: 8, clean: true})}},
		{name: "rebuild: the last seq seen live", cur: rebuilding(5, rebuildState{ran: true, next: 5, clean: true}), in: rebuilt(5),
			want: seqDecision{kind: seqRebuilt, seq: 5,
				next: rebuilding(5, rebuildState{ran: true, next: 6, clean: true})}},
		{name: "rebuild: past the last seq, continuing the run: queued like catch-up", cur: rebuilding(5, rebuildState{ran: true, next: 6, clean: true}),
			in: rebuilt(6),
			want: seqDecision{kind: seqRebuilt, seq: 6,
				next: seqState{hasSeq: true, lastSeq: 6, dedup: true, dedupFrom: 6, rebuild: rebuildState{on: true, to: 5, ran: true, next: 7, clean: true}}}},
		{name: "rebuild: further past it, the window already open", cur: seqState{hasSeq: true, lastSeq: 6, dedup: true, dedupFrom: 6,
			rebuild: rebuildState{on: true, to: 5, ran: true, next: 7, clean: true}}, in: rebuilt(7),
			want: seqDecision{kind: seqRebuilt, seq: 7,
				next: seqState{hasSeq: true, lastSeq: 7, dedup: true, dedupFrom: 6, rebuild: rebuildState{on: true, to: 5, ran: true, next: 8, clean: true}}}},
		{name: "rebuild: past the last seq after a hole: left to the live socket", cur: rebuilding(5, rebuildState{ran: true, next: 4, clean: true}),
			in:   rebuilt(6),
			want: seqDecision{kind: seqAhead, drop: "rebuild_ahead", seq: 6, next: rebuilding(5, rebuildState{ran: true, next: 4, clean: true})}},
		{name: "rebuild: nothing but batches past the last seq", cur: rebuilding(5, rebuildState{}), in: rebuilt(6),
			want: seqDecision{kind: seqAhead, drop: "rebuild_ahead", seq: 6, next: rebuilding(5, rebuildState{})}},
		{name: "rebuild: a batch again", cur: rebuilding(5, rebuildState{ran: true, next: 3, clean: true}), in: rebuilt(2),
			want: seqDecision{kind: seqCopy, drop: "duplicate", seq: 2, next: rebuilding(5, rebuildState{ran: true, next: 3, clean: true})}},
		{name: "rebuild: none under way", cur: at(5), in: rebuilt(0),
			want: seqDecision{kind: seqAlien, drop: "rebuild_alien", next: at(5)}},
		{name: "rebuild: another epoch (the engine restarted since)",
			cur:  seqState{hasSeq: true, lastSeq: 5, epoch: "a", rebuild: rebuildState{on: true, to: 5}},
			in:   seqInput{seq: 0, how: fromRebuild, epoch: []byte("b")},
			want: seqDecision{kind: seqAlien, drop: "rebuild_alien", next: seqState{hasSeq: true, lastSeq: 5, epoch: "a", rebuild: rebuildState{on: true, to: 5}}}},
		{name: "rebuild: same epoch", cur: seqState{hasSeq: true, lastSeq: 5, epoch: "a", rebuild: rebuildState{on: true, to: 5}},
			in: seqInput{seq: 0, how: fromRebuild, epoch: []byte("a")},
			want: seqDecision{kind: seqRebuilt, clear: true,
				next: seqState{hasSeq: true, lastSeq: 5, epoch: "a", rebuild: rebuildState{on: true, to: 5, ran: true, next: 1, clean: true}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideSeq(tc.cur, tc.in)
			if d != tc.want {
				t.Fatalf("decideSeq(%+v, %+v)\n got %+v\nwant %+v", tc.cur, tc.in, d, tc.want)
			}
			if d.drop != "" || d.kind == seqRebuilt {
				return // nothing queued, or a rebuild's: no completeness (rebuildOutcome)
			}
			if !d.replay && tc.res != (replayResult{}) {
				t.Fatal("row gives a replay result but no replay is decided")
			}
			if c := d.completeness(tc.res); c != tc.wantC {
				t.Fatalf("completeness(%+v) = %+v, want %+v", tc.res, c, tc.wantC)
			}
		})
	}
}

// What a finished rebuild proves, from the run it rebuilt: complete only
// from an empty cache to the last seq seen live (rb.to).
func TestRebuildOutcome(t *testing.T) {
	type outcome struct {
		set   bool
		since uint64
		why   string
	}
	run := func(to, since, next uint64, clean bool) rebuildState {
		return rebuildState{on: true, to: to, ran: true, since: since, next: next, clean: clean}
	}
	for _, tc := range []struct {
		name    string
		rb      rebuildState
		aborted bool
		want    outcome
	}{
		{"from 0 to the last seq", run(5, 0, 6, true), false, outcome{set: true}},
		{"from 0 past the last seq", run(5, 0, 8, true), false, outcome{set: true}},
		{"from the engine's clear to the last seq", run(5, 3, 6, true), false, outcome{set: true, since: 3}},
		{"the buffer wrapped", run(5, 3, 6, false), false, outcome{set: true, since: 3, why: "replay_window"}},
		{"short of the last seq", run(5, 0, 5, true), false, outcome{}},
		{"a batch not queued", run(5, 0, 6, true), true, outcome{}},
		{"nothing rebuilt", rebuildState{on: true, to: 5}, false, outcome{}},
		{"nothing rebuilt of a stream at seq 0", rebuildState{on: true}, false, outcome{}},
		{"the last seq is 2^64-1", run(math.MaxUint64, 0, 0, true), false, outcome{set: true}},
		{"short of 2^64-1", run(math.MaxUint64, 0, math.MaxUint64, true), false, outcome{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, since, why := rebuildOutcome(tc.rb, tc.aborted)
			if got := (outcome{set, since, why}); got != tc.want {
				t.Fatalf("rebuildOutcome(%+v, %v) = %+v, want %+v", tc.rb, tc.aborted, got, tc.want)
			}
		})
	}
}

// Through the socket path: a stream whose last seq is 2^64-1 (resumed from
// a snapshot here) takes a small seq for a restart: the pod is cleared in
// front of the batch and the stream counts a restart, not a gap.
func TestSeqWrapIsRestart(t *testing.T) {
	s, src, _ := handleOnly(t, Config{}, nil)
	s.ResumeFrom("p", 0, math.MaxUint64, true)
	s.handle(context.Background(), src, frames(t, "kv@p@m", 3, storedBatch(10)))
	got := drain(s)
	if len(got) != 1 || got[0].Events[0].Kind != event.AllBlocksCleared {
		t.Fatalf("queued %+v, want the batch after a clear", got)
	}
	if st := s.Streams()[0]; st.Restarts != 1 || st.SeqGaps != 0 || st.LastSeq != 3 || st.IncompleteReason != "restart" {
		t.Fatalf("stream %+v", st)
	}
}
