package kvevents

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/kvindex"
)

// errStopped is returned by dispatcher.queue once shutdown has begun.
var errStopped = errors.New("kvevents: subscriber stopped")

// dispatcher owns the worker queues. A stream is pinned to one worker
// (workerFor), so its batches apply in the order they were queued while
// different streams apply in parallel.
//
// Shutdown (stop): no batch is accepted any more, the workers apply what is
// still queued until the drain bound expires, and what is left then is
// dropped and counted. The context given to BatchSink.Apply outlives the
// Run context by that bound, so a queued clear (an endpoint removed just
// before shutdown) still reaches the index, while a write hung on a dead
// backend is cancelled instead of holding the daemon.
type dispatcher struct {
	sink    kvindex.BatchSink
	queues  []chan *kvindex.Batch
	dropped prometheus.Counter
	log     *slog.Logger
	bp      backpressure // what a reader does on a full queue (backpressure.go)

	// mu is read-held while a batch is queued and write-held to stop, so
	// nothing is queued after the workers' final drain.
	mu      sync.RWMutex
	stopped bool

	applyCtx    context.Context
	applyCancel context.CancelFunc
	draining    chan struct{} // closed when shutdown begins
	workers     sync.WaitGroup
	lost        atomic.Int64 // batches dropped at shutdown, for the log
}

func newDispatcher(sink kvindex.BatchSink, workers, queueSize int, dropped prometheus.Counter, log *slog.Logger) *dispatcher {
	d := &dispatcher{sink: sink, queues: make([]chan *kvindex.Batch, workers), dropped: dropped, log: log,
		draining: make(chan struct{})}
	for i := range d.queues {
		d.queues[i] = make(chan *kvindex.Batch, queueSize)
	}
	return d
}

// workerFor spreads streams over the workers.
func (d *dispatcher) workerFor(k streamKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.pod))
	return int((h.Sum32() ^ uint32(k.rank)*0x9e3779b1) % uint32(len(d.queues)))
}

// tryQueue queues b for worker w without blocking; false means the queue is
// full (or shutdown has begun) and b was not queued.
func (d *dispatcher) tryQueue(w int, b *kvindex.Batch) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.stopped {
		return false
	}
	select {
	case d.queues[w] <- b:
		return true
	default:
		return false
	}
}

// queue queues b for worker w, waiting for room until ctx ends.
func (d *dispatcher) queue(ctx context.Context, w int, b *kvindex.Batch) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.stopped {
		return errStopped
	}
	select {
	case d.queues[w] <- b:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// start launches the workers. Apply's context keeps ctx's values but not
// its cancellation: stop ends it after the drain bound.
func (d *dispatcher) start(ctx context.Context) {
	d.applyCtx, d.applyCancel = context.WithCancel(context.WithoutCancel(ctx))
	for _, q := range d.queues {
		d.workers.Add(1)
		go func() {
			defer d.workers.Done()
			d.work(q)
		}()
	}
}

func (d *dispatcher) work(q chan *kvindex.Batch) {
	for {
		select {
		case b := <-q:
			d.apply(b)
		case <-d.draining:
			for {
				select {
				case b := <-q:
					d.apply(b)
				default:
					return
				}
			}
		}
	}
}

// apply hands b to the sink, or drops and counts it once the drain bound
// has passed (Apply's context is only ever cancelled by stop).
func (d *dispatcher) apply(b *kvindex.Batch) {
	if d.applyCtx.Err() != nil {
		d.dropped.Inc()
		d.lost.Add(1)
		return
	}
	d.sink.Apply(d.applyCtx, b)
}

// stop refuses new batches, lets the workers apply what is queued for at
// most drain (none when drain < 0) and returns once they have finished.
// Callers queueing with queue must be able to return (their ctx ended).
func (d *dispatcher) stop(drain time.Duration) {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	if drain > 0 {
		t := time.AfterFunc(drain, d.applyCancel)
		defer t.Stop()
	} else {
		d.applyCancel()
	}
	close(d.draining)
	d.workers.Wait()
	d.applyCancel()
	if n := d.lost.Load(); n > 0 {
		d.log.Warn("batches still queued at shutdown were dropped", "dropped", n, "drain_timeout", drain)
	}
}
