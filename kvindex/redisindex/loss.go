package redisindex

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Loss detection. Redis can lose the index behind the daemon's back without
// a single failed call: a server killed and restarted empty (or from an old
// RDB) while no pod writes, keys evicted under maxmemory (volatile-lru
// evicts block keys, which all carry a TTL), a FLUSHDB. The index then
// answers from what is left as if nothing happened, and the event streams
// still say complete. A watcher notices each of these and tells the
// functions registered with OnLost, which mark what the index lost
// incomplete (the indexer wires it to the event subscriber):
//
//   - "restart": the run_id of INFO server changed on a node's address
//     (a new process, whatever it loaded);
//   - "eviction": evicted_keys of INFO stats grew on a node (Redis counts
//     every evicted key of the server, not only ours: with a Redis shared
//     with other applications, their evictions count too, conservatively);
//   - "flush": the sentinel key <ns>:alive (no TTL, so volatile-* policies
//     never evict it) was gone, e.g. after FLUSHDB/FLUSHALL.
//
// On Cluster each master is checked (re-listed at every round, so a failover
// is followed: a new master's address is a baseline, not a restart; writes it
// never received from the old master are not detected). The check runs at
// start and every Config.LossCheck (default DefaultLossCheck); a node that
// does not answer is skipped until it does.

// lossWatch is the watcher's state; baselines per node address.
type lossWatch struct {
	mu       sync.Mutex
	runID    map[string]string
	evicted  map[string]int64
	sentinel bool // the sentinel key was seen (set or found) once
	notify   []func(reason string)
}

// OnLost registers f, called from the watcher's goroutine with "restart",
// "eviction" or "flush" each time Redis is found to have lost index entries
// (see loss.go). f must not block for long.
func (x *Index) OnLost(f func(reason string)) {
	x.loss.mu.Lock()
	x.loss.notify = append(x.loss.notify, f)
	x.loss.mu.Unlock()
}

func (x *Index) watchLoss(ctx context.Context, every time.Duration) {
	defer x.watchers.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, x.callTimeout)
		x.checkLoss(cctx)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkLoss runs one round of checks and reports what it found.
func (x *Index) checkLoss(ctx context.Context) {
	// One report per round, the most telling reason first: a restart
	// also empties the sentinel, and a restarted node's eviction count
	// starts again.
	var mu sync.Mutex
	var restart, evicted, flushed bool
	node := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server", "stats").Result()
		if err != nil {
			return nil // unreachable now: checked again when it answers
		}
		runID, evKeys := infoField(info, "run_id"), infoField(info, "evicted_keys")
		n, _ := strconv.ParseInt(evKeys, 10, 64)
		addr := c.Options().Addr
		x.loss.mu.Lock()
		prevID, seen := x.loss.runID[addr]
		prevEv := x.loss.evicted[addr]
		x.loss.runID[addr], x.loss.evicted[addr] = runID, n
		x.loss.mu.Unlock()
		switch {
		case !seen:
		case prevID != runID:
			mu.Lock()
			restart = true
			mu.Unlock()
		case n > prevEv:
			mu.Lock()
			evicted = true
			mu.Unlock()
		}
		return nil
	}
	if cc, ok := x.c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, node)
	} else if c, ok := x.c.(*redis.Client); ok {
		_ = node(ctx, c)
	}
	if created, err := x.c.SetNX(ctx, x.ns+":alive", "1", 0).Result(); err == nil {
		x.loss.mu.Lock()
		was := x.loss.sentinel
		x.loss.sentinel = true
		x.loss.mu.Unlock()
		flushed = created && was
	}
	var r string
	switch {
	case restart:
		r = "restart"
	case flushed:
		r = "flush"
	case evicted:
		r = "eviction"
	default:
		return
	}
	x.loss.mu.Lock()
	fs := append([]func(string){}, x.loss.notify...)
	x.loss.mu.Unlock()
	x.lost.Add(1)
	x.log.Warn("redis lost index entries: the pods' index is marked incomplete", "reason", r)
	for _, f := range fs {
		f(r)
	}
}

// Losses is how many times the watcher found Redis had lost entries.
func (x *Index) Losses() int64 { return x.lost.Load() }

// infoField is the value of "field:" in an INFO reply ("" if absent).
func infoField(info, field string) string {
	for l := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v
		}
	}
	return ""
}
