package redisindex

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// What an Index keeps up to date besides the blocks: its copy of the pod
// epochs, the loaded scripts, and the stale entries readers found.

func (x *Index) epochOf(p kvindex.PodID) uint64 {
	x.emu.RLock()
	e := x.epochs[p]
	x.emu.RUnlock()
	return e
}

// ensureEpochs reloads the pods hash when its _v differs from our copy.
func (x *Index) ensureEpochs(ctx context.Context, ver string) error {
	x.emu.RLock()
	fresh := x.eLoaded && x.eVer == ver
	x.emu.RUnlock()
	if fresh {
		return nil
	}
	return x.loadEpochs(ctx)
}

// loadEpochs reads the whole pods hash (one command, one node): epochs,
// version, and the counters behind Stats.
func (x *Index) loadEpochs(ctx context.Context) error {
	m, err := x.c.HGetAll(ctx, x.podsKey).Result()
	if err != nil {
		return err
	}
	epochs := make(map[kvindex.PodID]uint64, len(m)/2)
	var entries int64
	for f, v := range m {
		switch {
		case strings.HasPrefix(f, "e:"):
			if p, ok := x.parsePodField(f[2:]); ok {
				if e, err := strconv.ParseUint(v, 10, 64); err == nil {
					epochs[p] = e
				}
			}
		case strings.HasPrefix(f, "m:"):
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				entries += n
			}
		}
	}
	keys, _ := strconv.ParseInt(m["_k"], 10, 64)
	x.emu.Lock()
	x.epochs, x.eVer, x.eLoaded = epochs, m["_v"], true
	x.emu.Unlock()
	x.entries.Store(entries)
	x.keys.Store(max(keys, 0))
	return nil
}

// ---- background --------------------------------------------------------

func (x *Index) background(ctx context.Context, every time.Duration) {
	defer close(x.done)
	t := time.NewTicker(every)
	defer t.Stop()
	batch := make([]cleanupItem, 0, 256)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Epochs and the Stats counters only: scripts are reloaded
			// on demand (NOSCRIPT) after a Redis restart.
			rctx, cancel := x.callCtx(ctx)
			_ = x.loadEpochs(rctx)
			cancel()
		case it := <-x.cleanup:
			batch = append(batch[:0], it)
		drain:
			for len(batch) < cap(batch) {
				select {
				case it := <-x.cleanup:
					batch = append(batch, it)
				default:
					break drain
				}
			}
			rctx, cancel := x.callCtx(ctx)
			x.runCleanup(rctx, batch)
			cancel()
		}
	}
}

func (x *Index) refresh(ctx context.Context) error {
	if err := x.loadScripts(ctx); err != nil {
		return err
	}
	return x.loadEpochs(ctx)
}

func (x *Index) loadScripts(ctx context.Context) error {
	for _, s := range allScripts {
		if err := s.Load(ctx, x.c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// runCleanup deletes stale entries found by readers (compare-and-delete),
// counting them as Expired. One pipelined round trip per node.
func (x *Index) runCleanup(ctx context.Context, items []cleanupItem) {
	pipe := x.c.Pipeline()
	cmds := make([]*redis.Cmd, len(items))
	for i, it := range items {
		cmds[i] = cleanupScript.EvalSha(ctx, pipe, []string{it.key}, it.field, it.value)
	}
	_, _ = pipe.Exec(ctx)
	if x.retryNoScript(ctx, cmds, func(i int) *redis.Cmd {
		return cleanupScript.Eval(ctx, x.c, []string{items[i].key}, items[i].field, items[i].value)
	}) != nil {
		return
	}
	var emptied int64
	for _, c := range cmds {
		r, err := c.Int64Slice()
		if err != nil || len(r) != 2 {
			continue
		}
		x.expired.Add(r[0])
		emptied += r[1]
	}
	if emptied > 0 {
		_ = countScript.Run(ctx, x.c, []string{x.podsKey}, "", "0", 0, 0, -emptied).Err()
	}
}

// retryNoScript re-runs, one by one with EVAL, the commands that failed with
// NOSCRIPT (Redis restarted or SCRIPT FLUSH); the script cache is reloaded
// for later pipelines. Any other error is returned.
func (x *Index) retryNoScript(ctx context.Context, cmds []*redis.Cmd, redo func(i int) *redis.Cmd) error {
	reloaded := false
	for i, c := range cmds {
		err := c.Err()
		if err == nil {
			continue
		}
		if !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return err
		}
		if !reloaded {
			_ = x.loadScripts(ctx)
			reloaded = true
		}
		cmds[i] = redo(i)
		if err := cmds[i].Err(); err != nil {
			return err
		}
	}
	return nil
}

// ---- write path ----------------------------------------------------------
