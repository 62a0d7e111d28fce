package kvevents

import (
	"context"

	"github.com/kvindex/kvindex/kvevents/event"
)

// Queueing runs on the readers' and the subscriber's goroutines, apart from
// the workers that drain it (dispatcher.go); a reader that finds its queue
// full waits as dispatcher_backpressure.go decides.

// tryQueue queues b for worker w without blocking; false means the queue is
// full (or shutdown has begun) and b was not queued.
func (d *dispatcher) tryQueue(w int, b *event.Batch, owner *streamBacklog) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.stopped {
		return false
	}
	size := batchBytes(b)
	if !d.budget.take(size) {
		return false
	}
	q := d.queues[w]
	select {
	case q.slots <- struct{}{}:
		q.push(queued{batch: b, owner: owner, size: size})
		return true
	default:
		d.budget.give(size)
		return false
	}
}

// queue queues b for worker w, waiting for room until ctx ends. It is for
// the subscriber's own small batches (clears): they are counted in the
// budget but never refused by it.
func (d *dispatcher) queue(ctx context.Context, w int, b *event.Batch) error {
	size := batchBytes(b)
	d.budget.used.Add(size)
	if err := d.send(ctx, w, queued{batch: b, size: size}); err != nil {
		d.budget.give(size)
		return err
	}
	return nil
}

// queueRecovery queues the recovery clear b (trust.go) like queue.
func (d *dispatcher) queueRecovery(ctx context.Context, w int, b *event.Batch) error {
	size := batchBytes(b)
	d.budget.used.Add(size)
	if err := d.send(ctx, w, queued{batch: b, size: size, recovery: true}); err != nil {
		d.budget.give(size)
		return err
	}
	return nil
}

// queueForget queues, behind what worker w holds, the order to forget pod's
// state in the sink (event.Sink.ForgetPod).
func (d *dispatcher) queueForget(ctx context.Context, w int, pod string, rank int) error {
	return d.send(ctx, w, queued{forget: &streamKey{pod: pod, rank: rank}})
}

func (d *dispatcher) send(ctx context.Context, w int, q queued) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.stopped {
		return errStopped
	}
	wq := d.queues[w]
	select {
	case wq.slots <- struct{}{}:
		wq.push(q)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
