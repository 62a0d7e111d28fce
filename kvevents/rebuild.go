package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// Rebuilding a stream the index lost, from the engine's replay buffer.
//
// When the index backend loses a pod's entries (MarkIndexLost: a Redis
// restarted empty, evicting or flushed; a write that failed), later batches
// rebuild only what they carry. An endpoint with a snapshot address
// (SGLang) is repaired by a snapshot at the stream's next batch. One with
// only a replay address (vLLM) has no snapshot, but its replay buffer holds
// the lifetime's batches from seq 0 until it wraps (buffer_steps, 10,000 by
// default). So the stream is rebuilt at once, idle or not: the pod is
// cleared, in order, through the queue its batches take, and the buffer is
// asked for from seq 0 and queued behind the clear. The stream is complete
// again only if the rebuilt run provably covers the lifetime: it starts at
// seq 0 (or at the engine's own AllBlocksCleared) and runs without a hole to
// the last batch seen live (decideRebuild, rebuildOutcome). A wrapped buffer
// leaves it incomplete ("replay_window", complete since the first batch
// replayed); a failed, timed-out or overflowing rebuild leaves it with the
// reason it had ("index_lost"); every outcome is counted in
// kvindexd_kvevents_rebuilds_total.
//
// The rebuild holds the stream's order for the exchange, as a gap replay
// does, so a live batch that arrives meanwhile waits for it and is queued
// after it. Bounds: one exchange of RebuildTimeout, queuing included (a
// rebuild waits for room in the pod's share of its worker instead of
// overflowing, since it queues a whole buffer for one pod); the batches
// rebuilt are those up to the last seq seen live and the run that continues
// it, each at most once; at most rebuildWorkers rebuilds at a time, each
// stream queued once however often it is marked, and each replay exchange
// held to its endpoint's share of a worker (rebuild_budget.go). A mark while its rebuild
// runs means what it queued may be lost too: the outcome is not trusted
// ("superseded") and the stream is rebuilt again, not before rebuildSpacing
// after the previous one began, so a Redis that keeps evicting (or failing)
// does not make the engine resend its buffer in a loop.

const (
	// rebuildWorkers bounds the rebuilds in progress at once: a loss of the
	// whole index marks every stream at the same moment.
	rebuildWorkers = 4
	// defaultRebuildSpacing is the least time between the beginnings of
	// two rebuilds of one stream.
	defaultRebuildSpacing = 5 * time.Second
)

// rebuildPhase is where a stream's rebuild by replay stands.
type rebuildPhase uint8

const (
	rebuildIdle rebuildPhase = iota
	// rebuildPending: in the rebuild queue, or waiting for rebuildSpacing.
	rebuildPending
	rebuildRunning
	// rebuildRunningAgain: marked again while running: what it rebuilt may be
	// lost too, so it runs again.
	rebuildRunningAgain
)

// rebuilds is the Subscriber's rebuild queue, guarded by Subscriber.mu: the
// streams waiting for a worker (each at most once: rebuildPending) and the
// workers running.
type rebuilds struct {
	queue      []*stream
	workers    int
	spacing    time.Duration
	mergeBytes int64 // rebuildMergeBytes
}

// scheduleRebuild queues st for a rebuild if its endpoint has a replay
// address and no snapshot address, or notes that it must run again if one
// is running. It takes only the short locks: the caller may be the sink.
func (s *Subscriber) scheduleRebuild(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch st.rebuildPhase {
	case rebuildRunning, rebuildRunningAgain:
		st.rebuildPhase = rebuildRunningAgain
		return
	case rebuildPending:
		return
	}
	src := s.sourceLocked(st.stats.Endpoint, st.key.pod)
	if !s.running || s.runCtx.Err() != nil || src == nil || src.replay == "" || src.snapshot != "" || s.streams[st.key] != st {
		return
	}
	st.rebuildPhase, st.stats.Rebuilding = rebuildPending, true
	if wait := s.rebuilds.spacing - time.Since(st.lastRebuild); !st.lastRebuild.IsZero() && wait > 0 {
		time.AfterFunc(wait, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.queueRebuildLocked(st)
		})
		return
	}
	s.queueRebuildLocked(st)
}

// queueRebuildLocked puts st in the rebuild queue and starts a worker if
// fewer than rebuildWorkers run. s.mu is held; the check of runCtx under it
// is what keeps every worker counted in s.readers before Run waits for them.
func (s *Subscriber) queueRebuildLocked(st *stream) {
	if s.runCtx.Err() != nil || s.streams[st.key] != st {
		return // stopping, or the stream was forgotten: nothing to rebuild
	}
	s.rebuilds.queue = append(s.rebuilds.queue, st)
	if s.rebuilds.workers < rebuildWorkers {
		s.rebuilds.workers++
		s.readers.Add(1)
		go s.rebuildWorker()
	}
}

// rebuildsQueued is the length of the rebuild queue.
func (s *Subscriber) rebuildsQueued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rebuilds.queue)
}

func (s *Subscriber) rebuildWorker() {
	defer s.readers.Done()
	for {
		s.mu.Lock()
		if len(s.rebuilds.queue) == 0 || s.runCtx.Err() != nil {
			s.rebuilds.workers--
			s.mu.Unlock()
			return
		}
		st := s.rebuilds.queue[0]
		s.rebuilds.queue[0] = nil
		s.rebuilds.queue = s.rebuilds.queue[1:]
		s.mu.Unlock()
		if s.rebuildStream(st) {
			s.scheduleRebuild(st)
		}
	}
}

// rebuildStream runs one rebuild of st and reports whether it must run
// again (marked while it ran).
func (s *Subscriber) rebuildStream(st *stream) (again bool) {
	st.mu.Lock()
	st.rebuildPhase, st.lastRebuild = rebuildRunning, time.Now()
	st.mu.Unlock()
	st.order.Lock()
	defer st.order.Unlock()
	// Under s.mu, and with the order held: expire skips a stream whose
	// order is held, and RemoveEndpoint waits for src.rebuilds once the
	// endpoint is out of the map, so neither forgets the stream while the
	// rebuild queues its batches.
	s.mu.Lock()
	st.mu.Lock()
	src := s.sourceLocked(st.stats.Endpoint, st.key.pod)
	st.mu.Unlock()
	ok := st.hasSeq && src != nil && src.ctx != nil && src.replay != "" && src.snapshot == "" && s.streams[st.key] == st
	if ok {
		src.rebuilds.Add(1)
	}
	s.mu.Unlock()
	var r rebuildRun
	if ok {
		r = s.rebuild(src.ctx, st, src)
		src.rebuilds.Done()
	}
	return s.finishRebuild(st, r, ok)
}

// rebuildRun is what one rebuild exchange did.
type rebuildRun struct {
	rebuilt rebuildState // the run it rebuilt
	got     uint64       // batches queued
	aborted bool         // a batch it meant to queue was not (no room in time, or overflow)
	err     error        // the exchange's
}

// rebuildMergeBytes bounds a batch a rebuild queues (batchBytes): the
// replayed batches are merged, in order, into batches of about this size.
// One replayed batch per Apply is one index round trip each: 10,000 of
// them (vLLM's default buffer) took 4 s on Redis.
const rebuildMergeBytes = 256 << 10

// rebuild asks src's replay address for every batch from seq 0 and queues
// those decideRebuild accepts, merged into batches of up to
// rebuildMergeBytes (their events in order: the applier applies one batch's
// events as it would the batches'), the pod's clear in front of the first.
// The stream's sequence state takes what was decided only once it is
// queued. st.order is held.
func (s *Subscriber) rebuild(ctx context.Context, st *stream, src *source) rebuildRun {
	st.mu.Lock()
	model := st.stats.Model
	st.mu.Unlock()
	st.rebuild = rebuildState{on: true, to: st.lastSeq}
	defer func() { st.rebuild = rebuildState{} }()
	s.mu.Lock()
	mergeBytes := s.rebuilds.mergeBytes
	s.mu.Unlock()
	// One bound for the exchange and the waits for room in the queue.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RebuildTimeout)
	defer cancel()
	var (
		r       rebuildRun
		cur     = st.seqState // with what is decided but not yet queued
		pending *event.Batch  // the merged batches not yet queued
		merged  uint64        // how many
		size    int64         // their batchBytes
		evErrs  int
		clear   bool // the pod's clear goes in front of pending
	)
	flush := func() {
		if pending == nil || r.aborted {
			return
		}
		if !st.backlog.waitRoom(ctx, size, s.dispatcher.share) {
			r.aborted = true
			return
		}
		if clear {
			st.needClear, st.clearWhy = true, "rebuild" // a synthetic clear's reason, not a completeness one
		}
		s.enqueue(st, pending)
		if st.needClear {
			r.aborted = true // overflowed: enqueue marked the stream
			return
		}
		st.seqState, clear = cur, false
		r.got += merged
		st.mu.Lock()
		st.stats.RebuiltBatches += merged
		st.stats.DecodeErrors += uint64(evErrs)
		st.stats.LastSeq = st.lastSeq
		st.mu.Unlock()
		pending, merged, size, evErrs = nil, 0, 0, 0
	}
	// The replay's own share of the worker (see replayBudget): the
	// exchange is cut, and the rebuild fails, when it breaks a budget or
	// outlives RebuildAttemptTimeout. The attempt's clock stops while the
	// rebuild waits for room in the pod's share (a slow index is not the
	// engine's fault); the whole rebuild's ctx does not.
	exCtx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	budget := newReplayBudget(st.lastSeq, s.cfg.RebuildMaxBytes)
	attempt := newPausableDeadline(s.cfg.RebuildAttemptTimeout, func() { cut(errRebuildAttempt) })
	defer attempt.stop()
	cutFor := func(err error) {
		r.aborted = true
		s.drop(err.Error())
		cut(err)
	}
	flushIn := func() {
		attempt.pause()
		flush()
		attempt.resume()
	}
	drop := func(reason string) {
		s.drop(reason)
		if err := budget.reply(0, 0, false); err != nil && !r.aborted {
			cutFor(err)
		}
	}
	r.err = fetchReplay(exCtx, src.replay, 0, s.cfg.RebuildTimeout, s.cfg.Transport, drop, func(topic []byte, seq uint64, payload []byte) {
		if r.aborted {
			return
		}
		if err := budget.reply(seq, len(topic)+len(payload), true); err != nil {
			cutFor(err)
			return
		}
		var epoch []byte
		if topic != nil {
			pod, _ := parseTopic(topic)
			_, epoch, _ = splitTopicMeta(topic)
			if src.pod == "" && string(pod) != st.key.pod {
				s.drop("rebuild_alien") // another stream of the endpoint
				return
			}
		}
		b := &event.Batch{Pod: st.key.pod, Model: model, Engine: src.engine, Seq: seq}
		ok, errs := s.decode(payload, b, src)
		if !ok || b.DPRank != st.key.rank {
			return
		}
		d := decideSeq(cur, seqInput{seq: seq, epoch: epoch, how: fromRebuild, clears: hasClear(b)})
		if d.drop != "" {
			s.drop(d.drop)
			return
		}
		cur, clear = d.next, clear || d.clear
		if pending == nil {
			pending = b
		} else {
			pending.Events = append(pending.Events, b.Events...)
			pending.Seq, pending.Timestamp = b.Seq, b.Timestamp
		}
		merged++
		size += batchBytes(b)
		evErrs += errs
		if size >= mergeBytes {
			flushIn()
		}
	})
	if cause := context.Cause(exCtx); r.err != nil && cause != nil && exCtx.Err() != nil {
		r.err = fmt.Errorf("%w (%w)", r.err, cause)
		if errors.Is(cause, errRebuildAttempt) {
			s.drop(errRebuildAttempt.Error())
		}
	}
	if parent.Err() == nil { // else the endpoint is being removed, or the subscriber stopping
		flush()
	}
	r.rebuilt = st.rebuild
	return r
}

// finishRebuild records the outcome of a rebuild (ran: it was attempted)
// and reports whether the stream must be rebuilt again. st.order is held.
func (s *Subscriber) finishRebuild(st *stream, r rebuildRun, ran bool) (again bool) {
	set, since, why := rebuildOutcome(r.rebuilt, r.aborted)
	st.mu.Lock()
	again = st.rebuildPhase == rebuildRunningAgain && ran // one that could not run could not again
	st.rebuildPhase, st.stats.Rebuilding = rebuildIdle, again
	result := "failed"
	switch {
	case !ran:
	case again:
		// Marked while it ran: what it queued may be lost too, so it
		// proves nothing; the mark's reason stands.
		result = "superseded"
	case set:
		st.setCompletionLocked(completion{since: since, why: why})
		st.indexLost = false
		result = "complete"
		if why != "" {
			result = why
		}
	}
	st.mu.Unlock()
	if !ran {
		return false
	}
	if result == "complete" || result == whyReplayWindow {
		st.incomplete = why != ""
		st.snapFailed = false
	}
	s.metrics.Rebuilds.WithLabelValues(result).Inc()
	s.metrics.RebuiltBatches.Add(float64(r.got))
	lvl := slog.LevelInfo
	if result != "complete" {
		lvl = slog.LevelWarn
	}
	s.log.Log(context.Background(), lvl, "pod rebuilt from the engine's replay buffer after the index lost it", "pod", st.key.pod,
		"dp_rank", st.key.rank, "result", result, "batches", r.got, "first_seq", r.rebuilt.since, "to_seq", r.rebuilt.to,
		"aborted", r.aborted, "err", r.err)
	return again
}
