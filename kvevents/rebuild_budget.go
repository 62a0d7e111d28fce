package kvevents

import (
	"errors"
	"sync"
	"time"
)

// A replay endpoint's share of a rebuild worker.
//
// The rebuild workers (rebuildWorkers) are shared by every endpoint, so a
// replay address that never ends its answer (streams forever, repeats a
// seq, or drips a reply now and then) would hold a worker for the whole
// RebuildTimeout, and rebuildWorkers of them would hold every worker while
// an honest pod waits in the queue with empty scores. Each exchange is
// therefore held to what an honest engine can send for the request it was
// asked:
//
//   - seqs strictly ascending: a replay answers its buffer once, in order,
//     so a repeated or falling seq is a replay that makes no progress;
//   - no seq past the last one seen live by more than rebuildAheadBatches
//     (what the engine may have published between that batch and the
//     request), and no more replies than that run holds;
//   - at most RebuildMaxBytes of topics and payloads;
//   - at most RebuildAttemptTimeout of exchange, the time spent waiting for
//     room in the pod's queue share excluded.
//
// A replay cut for any of these fails the rebuild (the pod stays
// "index_lost", its later batches rebuild what they carry), counted by
// reason in kvindexd_kvevents_dropped_frames_total. The queue is first in,
// first out and a stream marked again goes to its back, so an honest pod
// queued behind N hostile replay endpoints starts its rebuild within
// ceil(N/rebuildWorkers) x RebuildAttemptTimeout (docs/security.md).

const (
	// rebuildAheadBatches is how far past the last seq seen live a
	// rebuild's replay may run: the batches the engine published before it
	// answered, whose live copies wait behind the rebuild.
	rebuildAheadBatches = 1024
	// DefaultRebuildAttemptTimeout bounds one replay exchange of a rebuild.
	DefaultRebuildAttemptTimeout = 10 * time.Second
	// DefaultRebuildMaxBytes bounds the topics and payloads of one
	// rebuild's replay: vLLM's default buffer of 10,000 batches at 64 KiB.
	DefaultRebuildMaxBytes = 640 << 20
)

var (
	errRebuildNoProgress = errors.New("rebuild_replay_no_progress")
	errRebuildAhead      = errors.New("rebuild_replay_past_asked")
	errRebuildBytes      = errors.New("rebuild_replay_bytes")
	errRebuildAttempt    = errors.New("rebuild_replay_attempt_timeout")
)

// replayBudget is one rebuild exchange's account (used by the exchange's
// goroutine only).
type replayBudget struct {
	maxSeq, maxReplies uint64
	maxBytes, bytes    int64
	replies, lastSeq   uint64
	seen               bool
}

// newReplayBudget is the budget of a rebuild asked when the last seq seen
// live was to.
func newReplayBudget(to uint64, maxBytes int64) *replayBudget {
	maxSeq := to + rebuildAheadBatches
	if maxSeq < to { // wrapped: no bound from the seq
		maxSeq = ^uint64(0)
	}
	replies := maxSeq
	if replies != ^uint64(0) {
		replies++ // seqs 0..maxSeq
	}
	return &replayBudget{maxSeq: maxSeq, maxReplies: replies, maxBytes: maxBytes}
}

// reply accounts one reply: a batch with seq and size bytes (hasSeq), or a
// malformed one, which costs a reply. It returns why the exchange must be
// cut, or nil.
func (b *replayBudget) reply(seq uint64, size int, hasSeq bool) error {
	b.replies++
	if b.replies > b.maxReplies {
		return errRebuildAhead
	}
	if !hasSeq {
		return nil
	}
	if b.seen && seq <= b.lastSeq {
		return errRebuildNoProgress
	}
	if seq > b.maxSeq {
		return errRebuildAhead
	}
	b.seen, b.lastSeq = true, seq
	b.bytes += int64(size)
	if b.bytes > b.maxBytes {
		return errRebuildBytes
	}
	return nil
}

// pausableDeadline calls fire once d of running time has passed; the time
// between pause and resume does not count.
type pausableDeadline struct {
	mu      sync.Mutex
	left    time.Duration
	started time.Time
	timer   *time.Timer
	paused  bool
}

func newPausableDeadline(d time.Duration, fire func()) *pausableDeadline {
	return &pausableDeadline{left: d, started: time.Now(), timer: time.AfterFunc(d, fire)}
}

func (p *pausableDeadline) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return
	}
	if p.timer.Stop() {
		p.left -= time.Since(p.started)
		p.paused = true
	}
}

func (p *pausableDeadline) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		return
	}
	p.paused, p.started = false, time.Now()
	p.timer.Reset(max(p.left, 0))
}

func (p *pausableDeadline) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer.Stop()
}
