package kvevents

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// errStopped is returned by dispatcher.queue once shutdown has begun.
var errStopped = errors.New("kvevents: subscriber stopped")

// dispatcher owns the worker queues. A stream is pinned to one worker
// (workerFor), so its batches apply in the order they were queued while
// different streams apply in parallel; a worker serves its streams in turn
// (dispatcher_workqueue.go).
//
// Shutdown (stop): no batch is accepted any more, the workers apply what is
// still queued until the drain bound expires, and what is left then is
// dropped and counted. The context given to BatchSink.Apply outlives the
// Run context by that bound, so a queued clear (an endpoint removed just
// before shutdown) still reaches the index, while a write hung on a dead
// backend is cancelled instead of holding the daemon.
type dispatcher struct {
	sink event.Sink
	// rec records each Apply's outcome in the pod's trust (trust.go): the
	// Subscriber, nil in tests of the dispatcher alone.
	rec    *Subscriber
	queues []*workQueue
	// busy[w] is when worker w began the item it is applying (UnixNano; 0
	// = idle): how long the apply path has been stuck (dispatcher_stall.go).
	busy    []atomic.Int64
	dropped prometheus.Counter
	log     *slog.Logger
	// budget bounds the estimated memory of all queued batches together:
	// a count bound alone would let large batches hold gigabytes
	// (dispatcher_budget.go).
	budget       byteBudget
	share        queueShare   // each stream's share of its worker (dispatcher_share.go)
	backpressure backpressure // what a reader does on a full queue (dispatcher_backpressure.go)

	// mu is read-held while a batch is queued and write-held to stop, so
	// nothing is queued after the workers' final drain.
	mu      sync.RWMutex
	stopped bool

	applyCtx    context.Context
	applyCancel context.CancelFunc
	draining    chan struct{} // closed when shutdown begins
	workers     sync.WaitGroup
	lost        atomic.Int64 // batches dropped at shutdown, for the log
	views       []turnView   // per worker (applyTurn)
}

func newDispatcher(sink event.Sink, workers, queueSize int, queueBytes int64, m *Metrics, log *slog.Logger) *dispatcher {
	d := &dispatcher{sink: sink, queues: make([]*workQueue, workers), busy: make([]atomic.Int64, workers), views: make([]turnView, workers),
		dropped: m.ShutdownDropped, log: log, draining: make(chan struct{}), budget: byteBudget{limit: queueBytes},
		share: newQueueShare(queueSize, queueBytes)}
	for i := range d.queues {
		d.queues[i] = newWorkQueue(queueSize)
	}
	return d
}

// queued is one item of a worker's queue: a batch to apply, or the order to
// forget a pod (its state in the sink), which must run in order behind the
// pod's batches and so travels the same queue.
type queued struct {
	batch *event.Batch
	// forget, when set, names the pod to forget; batch is nil then.
	forget *streamKey
	// recovery: batch is a clear queued for a pod held after a failed
	// write (trust.go), skipped if the pod was cleared since.
	recovery bool
	// owner is the stream's share the batch holds (nil for the
	// subscriber's own clears, queued outside the shares).
	owner *streamBacklog
	// size is what the batch was charged (batchBytes) in the byte budget
	// and its owner's share; the worker's turns are counted in it too.
	size int64
	// A snapshot applied in turns (dispatcher_workqueue.go): turn says
	// which this is (turnNone for any other item), and the turn applies
	// the snapshot's records [turnFrom, turnEnd). In the queue, turnFrom is
	// where the next turn starts.
	turn              turnKind
	turnFrom, turnEnd int
}

type turnKind uint8

const (
	turnNone turnKind = iota
	turnPart          // more turns follow: the item is still queued
	turnLast          // the item is released with it
)

// inTurns reports whether the item is a snapshot applied in turns, and its
// records: a batch whose last event is a BlockSnapshot (the events before it,
// a synthetic clear at most, go with its first turn) larger than a quantum.
func (it *queued) inTurns() (int, bool) {
	if it.batch == nil || it.size <= drrQuantum {
		return 0, false
	}
	if ev := lastSnapshot(it.batch); ev != nil {
		return len(ev.BlockHashes), true
	}
	return 0, false
}

// lastSnapshot is b's last event if it is a BlockSnapshot (nil otherwise).
func lastSnapshot(b *event.Batch) *event.Event {
	if n := len(b.Events); n > 0 && b.Events[n-1].Kind == event.BlockSnapshot && !b.Events[n-1].SnapshotPart {
		return &b.Events[n-1]
	}
	return nil
}

// turnView is a worker's batch for one turn of a snapshot: reused, so a turn
// allocates nothing.
type turnView struct {
	b   event.Batch
	evs []event.Event
}

// workerFor spreads streams over the workers.
func (d *dispatcher) workerFor(k streamKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.pod))
	return int((h.Sum32() ^ uint32(k.rank)*0x9e3779b1) % uint32(len(d.queues)))
}

// start launches the workers. Apply's context keeps ctx's values but not
// its cancellation: stop ends it after the drain bound.
func (d *dispatcher) start(ctx context.Context) {
	d.applyCtx, d.applyCancel = context.WithCancel(context.WithoutCancel(ctx))
	for w := range d.queues {
		d.workers.Add(1)
		go func() {
			defer d.workers.Done()
			d.work(w)
		}()
	}
}

// work applies worker w's items until shutdown, then what is still queued.
func (d *dispatcher) work(w int) {
	q := d.queues[w]
	for {
		it, ok := q.take(d.draining)
		if !ok {
			break
		}
		d.applyTimed(w, it)
	}
	for {
		it, ok := q.pop()
		if !ok {
			return
		}
		d.applyTimed(w, it)
	}
}

// applyTimed is apply with worker w marked busy meanwhile.
func (d *dispatcher) applyTimed(w int, it queued) {
	d.busy[w].Store(time.Now().UnixNano())
	if it.turn != turnNone {
		d.applyTurn(&d.views[w], it)
	} else {
		d.apply(it)
	}
	d.busy[w].Store(0)
}

// applyTurn applies one turn of a snapshot (dispatcher_workqueue.go): the
// records [turnFrom, turnEnd), the first turn with the events before the
// snapshot and as the BlockSnapshot that replaces the pod's state, the
// later ones as its parts (event.Event.SnapshotPart). The last turn gives
// back what the item held. A turn that fails (the sink left the pod
// untrusted) or finds shutdown past its drain bound cuts the snapshot
// there: the records after it are dropped, as the rest of a failed batch is.
// Only this worker reads the snapshot's records while the item is queued
// (pop, on this goroutine), so the cut needs no lock.
func (d *dispatcher) applyTurn(v *turnView, it queued) {
	b := it.batch
	snap := lastSnapshot(b)
	if it.turn == turnLast {
		defer d.budget.give(it.size)
		if it.owner != nil {
			defer it.owner.applied(it.size)
			defer it.owner.snapshotApplied()
		}
	}
	if d.applyCtx.Err() != nil {
		snap.BlockHashes = snap.BlockHashes[:it.turnEnd]
		if it.turn == turnLast {
			d.dropped.Inc()
			d.lost.Add(1)
		}
		return
	}
	if it.turnFrom == it.turnEnd {
		return // cut after a failed turn: only the release is left
	}
	v.b = event.Batch{Pod: b.Pod, Model: b.Model, DPRank: b.DPRank, Engine: b.Engine, Seq: b.Seq, Timestamp: b.Timestamp}
	evs := v.evs[:0]
	if it.turnFrom == 0 {
		evs = append(evs, b.Events[:len(b.Events)-1]...)
	}
	evs = append(evs, *snap)
	part := &evs[len(evs)-1]
	part.BlockHashes, part.SnapshotPart = snap.BlockHashes[it.turnFrom:it.turnEnd], it.turnFrom > 0
	v.b.Events = evs
	o := d.sink.Apply(d.applyCtx, &v.b)
	if d.rec != nil {
		d.rec.applied(&v.b, o)
	}
	if o.IndexFailed {
		snap.BlockHashes = snap.BlockHashes[:it.turnEnd]
	}
	// Nothing of the snapshot stays reachable from the worker once it is
	// released.
	clear(evs)
	v.evs, v.b = evs[:0], event.Batch{}
}

// apply hands the item to the sink, or drops and counts a batch once the
// drain bound has passed (Apply's context is only ever cancelled by stop).
func (d *dispatcher) apply(it queued) {
	if it.forget != nil {
		if d.applyCtx.Err() == nil {
			d.sink.ForgetPod(d.applyCtx, it.forget.pod, it.forget.rank)
		}
		return
	}
	b := it.batch
	defer d.budget.give(it.size)
	if it.owner != nil {
		defer it.owner.applied(it.size)
		if lastSnapshot(b) != nil {
			defer it.owner.snapshotApplied()
		}
	}
	if d.applyCtx.Err() != nil {
		d.dropped.Inc()
		d.lost.Add(1)
		return
	}
	if it.recovery && d.rec != nil && !d.rec.recoveryDue(b) {
		return
	}
	o := d.sink.Apply(d.applyCtx, b)
	if d.rec != nil {
		d.rec.applied(b, o)
	}
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
