package kvevents

import (
	"context"
	"sync"
	"time"
)

// Per-pod share of a worker. A stream is pinned to one worker, and a worker
// applies its queue in order, so before this bound a few pods flooding large
// store+remove batches on a worker held the whole worker queue (and the byte
// budget): an honest pod on the same worker saw its updates reach scores up
// to 17 s late while it was listed complete, with no overflow. Now each
// stream may hold at most its share of queued batches and bytes; past it
// that stream overflows at once (no QueueWait: on the bind socket one reader
// serves every connection, and waiting would stall the others too). The
// share bounds what one stream holds; the worker serving its streams in
// turn (dispatcher_workqueue.go) bounds how long the others wait behind it.
//
// The share does not bound a first batch: a stream with nothing queued may
// always queue one (the byte budget's rule for large batches).
const (
	// shareBytesMin is the least byte share of a stream: the share is
	// QueueBytes/64 (4 MiB at the default 256 MiB), at least this.
	shareBytesMin = 1 << 20
	// shareDivisor: a stream holds at most 1/shareDivisor of its
	// worker's queue (--queue-size: 256 of the default 1,024 batches), or
	// shareBatchesMin batches if that is more (a small queue is shared
	// by count only as far as it can be).
	shareDivisor    = 4
	shareBatchesMin = 64
)

// queueShare is the bound every stream's backlog is held to.
type queueShare struct {
	batches int // 0: no count share
	bytes   int64
}

func newQueueShare(queueSize int, queueBytes int64) queueShare {
	n := max(queueSize/shareDivisor, min(queueSize, shareBatchesMin), 1)
	if n >= queueSize {
		n = 0 // the worker's queue itself is the bound
	}
	return queueShare{batches: n, bytes: max(queueBytes/64, shareBytesMin)}
}

// streamBacklog is what one stream holds in its worker's queue: how many
// batches, their bytes and when each was queued (a ring, oldest first), so
// the stream can say how late its updates are (StreamStats.ApplyLag).
type streamBacklog struct {
	mu       sync.Mutex
	batches  int
	bytes    int64
	queuedAt []int64 // enqueue times (UnixNano), ring from head; grows to the share
	head     int
	// space is signalled when a batch is applied, for a rebuild waiting
	// for room in its share (waitRoom); made by the first such wait.
	space chan struct{}
	// snapshots is how many of the queued batches are engine snapshots:
	// while one is, the stream is not complete (a snapshot is applied in
	// turns, and between them the index holds only part of it).
	snapshots int
}

func (q *streamBacklog) snapshotQueued() {
	q.mu.Lock()
	q.snapshots++
	q.mu.Unlock()
}

func (q *streamBacklog) snapshotApplied() {
	q.mu.Lock()
	q.snapshots--
	q.mu.Unlock()
}

// full reports whether a batch of size bytes would be refused under share.
func (q *streamBacklog) full(size int64, share queueShare) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.batches > 0 && (share.batches > 0 && q.batches >= share.batches || q.bytes+size > share.bytes)
}

// waitRoom waits until a batch of size bytes fits in the share, or ctx
// ends (false). Only the holder of the stream's order queues for it, so
// the room found is still there when it queues. A rebuild waits here
// rather than overflow: it queues a whole replay buffer for one pod, far
// past its share, faster than the index applies it.
func (q *streamBacklog) waitRoom(ctx context.Context, size int64, share queueShare) bool {
	q.mu.Lock()
	if q.space == nil {
		q.space = make(chan struct{}, 1)
	}
	space := q.space
	q.mu.Unlock()
	for q.full(size, share) {
		select {
		case <-space:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// reserve takes room for one batch of size bytes under share, or reports
// false without taking any.
func (q *streamBacklog) reserve(size int64, share queueShare, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.batches > 0 && (share.batches > 0 && q.batches >= share.batches || q.bytes+size > share.bytes) {
		return false
	}
	if q.batches == len(q.queuedAt) { // grow the ring (amortized, at most to the share)
		at := make([]int64, max(4, 2*len(q.queuedAt)))
		for i := 0; i < q.batches; i++ {
			at[i] = q.queuedAt[(q.head+i)%len(q.queuedAt)]
		}
		q.queuedAt, q.head = at, 0
	}
	q.queuedAt[(q.head+q.batches)%len(q.queuedAt)] = now.UnixNano()
	q.batches++
	q.bytes += size
	return true
}

// unreserve gives back the latest reservation (its batch was not queued).
func (q *streamBacklog) unreserve(size int64) {
	q.mu.Lock()
	q.batches--
	q.bytes -= size
	q.mu.Unlock()
}

// applied gives back the oldest reservation: the worker is done with it.
func (q *streamBacklog) applied(size int64) {
	q.mu.Lock()
	q.batches--
	q.bytes -= size
	q.head = (q.head + 1) % len(q.queuedAt)
	if q.space != nil {
		select {
		case q.space <- struct{}{}:
		default: // a signal is pending already
		}
	}
	q.mu.Unlock()
}

// lag is the age of the stream's oldest batch still waiting to be applied,
// 0 only when none waits: a reader takes a complete stream without a lag
// for one whose batches are all in the index, so a wall clock stepped back
// since the batch was queued (the times are wall clock) gives the least
// lag, not none.
func (q *streamBacklog) lag(now time.Time) time.Duration {
	lag, _ := q.state(now)
	return lag
}

// state is lag and whether an engine snapshot is still being applied.
func (q *streamBacklog) state(now time.Time) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.batches == 0 {
		return 0, q.snapshots > 0
	}
	return max(now.Sub(time.Unix(0, q.queuedAt[q.head])), time.Nanosecond), q.snapshots > 0
}

// maxApplyLag is the largest ApplyLag of all streams.
func (s *Subscriber) maxApplyLag() time.Duration {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var worst time.Duration
	for _, st := range s.streams {
		worst = max(worst, st.backlog.lag(now))
	}
	return worst
}
