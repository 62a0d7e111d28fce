package kvevents

import (
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultQueueWait is how long a socket reader waits for room in a full
// worker queue before it drops the batch (Config.QueueWait).
const DefaultQueueWait = time.Second

// Backpressure before loss. A full worker queue means the sink is behind.
// Dropping the batch at once would make the pod's index state incomplete,
// which costs a clear of everything the pod holds (a synthetic
// AllBlocksCleared) and makes its prefixes cold for routing until the engine
// has republished them. So the reader that decoded the batch first waits, up
// to wait, for the worker to make room. While it waits it reads nothing more
// from its socket: the TCP window closes and the publisher's ZeroMQ queue
// absorbs the burst (and, past its high-water mark, drops whole messages,
// which the sequence check then sees as a gap and replays when the engine
// has a replay socket). Only a sink that stays behind for the whole wait
// loses the batch and clears the pod, counted and logged as an overflow.
type backpressure struct {
	wait     time.Duration // < 0: never wait (drop at once)
	waits    prometheus.Counter
	waitSecs prometheus.Counter
}

// queueBounded queues b for worker w, waiting up to d.bp.wait for room; false
// means b was not queued (still full, or shutdown has begun). owner is the
// stream's share (dispatcher_share.go): a stream past its share is refused at once,
// without waiting. Its reader may be the only one of the bind socket (one
// receive loop serves every connection there), so waiting on a flooder's
// share would hold every other pod of that socket behind it.
func (d *dispatcher) queueBounded(w int, owner *streamBacklog, b *event.Batch) bool {
	size := batchBytes(b)
	var t *time.Timer
	var start time.Time
	timer := func() <-chan time.Time {
		if t == nil {
			start, t = time.Now(), time.NewTimer(d.backpressure.wait)
		}
		return t.C
	}
	defer func() {
		if t != nil {
			t.Stop()
			if d.backpressure.waits != nil {
				d.backpressure.waits.Inc()
				d.backpressure.waitSecs.Add(time.Since(start).Seconds())
			}
		}
	}()
	if owner != nil && !owner.reserve(size, d.share, time.Now()) {
		return false
	}
	// A snapshot is counted as pending before the worker can see it, so
	// its stream says incomplete until the worker is done with it.
	snap := owner != nil && lastSnapshot(b) != nil
	if snap {
		owner.snapshotQueued()
	}
	ok := d.tryQueue(w, b, owner) || d.backpressure.wait > 0 && d.waitQueue(w, b, owner, size, timer)
	if !ok && owner != nil {
		owner.unreserve(size)
		if snap {
			owner.snapshotApplied()
		}
	}
	return ok
}

// waitQueue waits, until timer fires, for room in worker w's full queue.
func (d *dispatcher) waitQueue(w int, b *event.Batch, owner *streamBacklog, size int64, timer func() <-chan time.Time) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.stopped {
		return false
	}
	// Waiting is for a full queue; a batch the byte budget refuses is
	// refused now (waiting must not let it in over the budget).
	if !d.budget.take(size) {
		return false
	}
	q := d.queues[w]
	select {
	case q.slots <- struct{}{}:
		q.push(queued{batch: b, owner: owner, size: size})
		return true
	case <-timer():
	case <-d.draining:
	}
	d.budget.give(size)
	return false
}
