package redisindex

import (
	"context"
	"strconv"
	"sync"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// Write coalescing ("group commit"). Every Add/Remove becomes a writeReq
// queued on the index's committer. When no flush is running, the caller
// flushes at once (no added latency); requests that arrive while a flush is
// on the wire wait, and the next flush sends all of them (up to
// maxCoalesceReqs requests / maxCoalesceKeys keys) in ONE pipeline for the
// block scripts and ONE for the pod counters, however many pods they come
// from. Under load the number of round trips therefore grows with the
// number of flushes, not of writes.
//
// Order: a caller waits until its own request is flushed, so a pod whose
// writes come from one goroutine (the Applier serialises each pod) has at
// most one request queued, and consecutive requests of one caller are
// flushed in order. Requests of one flush are sent in queue order over one
// connection per node, so two writes of the same key are applied in the
// order they were queued. Each request keeps its own result: an error (a
// node down, a timeout) fails exactly the requests whose commands failed.
//
// The queue needs no cap of its own: every queued request has a caller
// blocked on it, so it never holds more requests than there are
// concurrent writers. maxCoalesce* bound one pipeline (request and reply
// buffers), not the queue.
const (
	maxCoalesceReqs = 64
	maxCoalesceKeys = 16384
)

// writeReq is one Add/Remove on its way through the committer.
type writeReq struct {
	ctx   context.Context
	op    writeOp
	podF  string
	epoch uint64
	es    string // epoch, decimal
	bkeys []string
	args  []any

	// set by the flush
	groups [][]string   // keys of each script run (all keys, or one per run on Cluster)
	cmds   []*redis.Cmd // one per group
	count  *redis.Cmd   // counter update, nil when the write changed nothing
	cargs  []any        // its ARGV, for a NOSCRIPT retry
	behind bool         // an entry carried a newer epoch than ours
	err    error

	lead bool          // promoted to flush the queue (under committer.mu)
	wake chan struct{} // buffered(1): done, or promoted
}

// committer is the write queue; see the comment above.
type committer struct {
	mu      sync.Mutex
	queue   []*writeReq
	running bool // a caller is flushing; invariant: !running => queue empty
}

// WriteStats are the write-coalescing counters: Requests Add/Remove calls
// that reached Redis, Flushes the pipelines they were sent in (Requests /
// Flushes is the mean batch size).
type WriteStats struct {
	Requests, Flushes int64
}

// WriteStats returns the write-coalescing counters since New.
func (x *Index) WriteStats() WriteStats {
	return WriteStats{Requests: x.wReqs.Load(), Flushes: x.wFlushes.Load()}
}

// pendingWrites is the number of requests waiting for a flush (tests).
func (x *Index) pendingWrites() int {
	x.wc.mu.Lock()
	defer x.wc.mu.Unlock()
	return len(x.wc.queue)
}

// submit queues r and returns once it has been flushed (r.err, r.behind
// set), flushing it (and whatever queued behind it) itself when no flush is
// running.
func (x *Index) submit(r *writeReq) {
	c := &x.wc
	r.wake = make(chan struct{}, 1)
	c.mu.Lock()
	c.queue = append(c.queue, r)
	if c.running {
		c.mu.Unlock()
		<-r.wake
		c.mu.Lock()
		lead := r.lead
		c.mu.Unlock()
		if !lead {
			return // a flush done by another caller included r
		}
	} else {
		c.running = true
		c.mu.Unlock()
	}
	// r is at the head of the queue: a new leader found it empty, a
	// promoted one was the head when promoted.
	c.mu.Lock()
	n, keys := 0, 0
	for n < len(c.queue) && n < maxCoalesceReqs && (n == 0 || keys+len(c.queue[n].bkeys) <= maxCoalesceKeys) {
		keys += len(c.queue[n].bkeys)
		n++
	}
	batch := make([]*writeReq, n)
	copy(batch, c.queue)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	c.mu.Unlock()

	x.flush(r.ctx, batch)

	c.mu.Lock()
	if len(c.queue) > 0 {
		next := c.queue[0]
		next.lead = true
		next.wake <- struct{}{}
	} else {
		c.running = false
	}
	c.mu.Unlock()
	for _, q := range batch {
		if q != r {
			q.wake <- struct{}{}
		}
	}
}

// flush sends the batch: one pipeline of block scripts (plus the pods
// hash version), one of counter updates, then one epoch check for all.
// It runs under the leader's context minus its cancellation and deadline
// (the batch carries other callers' writes), bounded as a whole by
// CallTimeout. There is one flush in flight for all pods: a node that stops
// answering holds it, and so every writer, for one CallTimeout, after which
// its guard (guard.go) fails its part of every pipeline at once while the
// other nodes' parts are applied (each request keeps its own result). The
// writes it fails make their pods untrusted (the applier). A request whose
// own context is already done is not sent, so a write waits at most for
// the flush ahead of it and then fails at its own deadline.
func (x *Index) flush(ctx context.Context, batch []*writeReq) {
	ctx, cancel := x.callCtx(context.WithoutCancel(ctx))
	defer cancel()
	x.wFlushes.Add(1)
	x.wReqs.Add(int64(len(batch)))
	pipe := x.c.Pipeline()
	verCmd := pipe.HGet(ctx, x.podsKey, "_v")
	live := batch[:0:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			continue
		}
		live = append(live, r)
		r.groups, r.cmds = r.groups[:0], r.cmds[:0]
		if x.cluster {
			for i := range r.bkeys {
				r.groups = append(r.groups, r.bkeys[i:i+1])
			}
		} else {
			r.groups = append(r.groups, r.bkeys)
		}
		for _, g := range r.groups {
			r.cmds = append(r.cmds, r.op.script.EvalSha(ctx, pipe, g, r.args...))
		}
	}
	if len(live) == 0 {
		return
	}
	_, _ = pipe.Exec(ctx)
	ver, err := verCmd.Result()
	if err != nil && err != redis.Nil {
		for _, r := range live {
			r.err = err
		}
		return
	}

	// Counter updates of every request whose scripts succeeded.
	cpipe := x.c.Pipeline()
	counted := live[:0:0]
	for _, r := range live {
		if r.err = x.retryNoScript(ctx, r.cmds, func(i int) *redis.Cmd {
			return r.op.script.Eval(ctx, x.c, r.groups[i], r.args...)
		}); r.err != nil {
			continue
		}
		var de, db, dk int64
		for _, c := range r.cmds {
			codes, err := c.Int64Slice()
			if err != nil {
				r.err = err
				break
			}
			e, b, k, behind := r.op.tally(codes)
			de, db, dk, r.behind = de+e, db+b, dk+k, r.behind || behind
		}
		if r.err == nil && (de != 0 || db != 0 || dk != 0) {
			r.cargs = []any{r.podF, r.es, de, db, dk}
			r.count = countScript.EvalSha(ctx, cpipe, []string{x.podsKey}, r.cargs...)
			counted = append(counted, r)
		}
	}
	if len(counted) > 0 {
		_, _ = cpipe.Exec(ctx)
		for _, r := range counted {
			r.err = x.retryNoScript(ctx, []*redis.Cmd{r.count}, func(int) *redis.Cmd {
				return countScript.Eval(ctx, x.c, []string{x.podsKey}, r.cargs...)
			})
		}
	}
	// One epoch check for the whole batch: the callers compare their
	// epochs with the (possibly reloaded) cache.
	if err := x.ensureEpochs(ctx, ver); err != nil {
		for _, r := range live {
			if r.err == nil {
				r.err = err
			}
		}
	}
}

// write is Add/Remove: one request through the committer, repeated under
// the pod's current epoch when another daemon cleared the pod since this
// process cached its epoch (what was written is invisible then). Bounded:
// epochs only grow.
func (x *Index) write(ctx context.Context, op writeOp, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	if len(keys) == 0 {
		return nil
	}
	if tier >= event.NumStoredTiers { // the shared tier is credited at score time, never stored
		return errInvalidTier(op, tier)
	}
	field := x.holderField(kvindex.Holder{Pod: pod, Tier: tier})
	if len(field) > maxFieldLen {
		return errFieldTooLong(op, field)
	}
	podF := x.podFieldOf(pod)
	bkeys := blockKeys(make([]string, 0, len(keys)), x.modelPrefix(model), keys)
	for attempt := 0; ; attempt++ {
		epoch := x.epochOf(pod)
		es := strconv.FormatUint(epoch, 10)
		r := &writeReq{ctx: ctx, op: op, podF: podF, epoch: epoch, es: es, bkeys: bkeys,
			args: op.args(field, epoch, es, x.ttlMS, podF)}
		x.submit(r)
		if r.err != nil {
			return unavailable(op.name, r.err)
		}
		if (r.behind || x.epochOf(pod) != epoch) && attempt < 3 && !op.remove {
			if r.behind {
				if err := x.loadEpochs(ctx); err != nil {
					return unavailable(op.name, err)
				}
			}
			if x.epochOf(pod) != epoch {
				continue
			}
		}
		return nil
	}
}
