package redisindex

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hung nodes. A node that stops answering with its connections open
// (SIGSTOP, a long DEBUG SLEEP or script, a host that froze) makes every call
// that touches it wait for its deadline (CallTimeout). A nodeGuard, a go-redis
// hook on each node's client, keeps that to the calls in flight when the
// node stopped:
//
//   - a call to the node that times out after waiting at least half of
//     CallTimeout marks the node hung (a caller's own short deadline, a
//     client that gave up after a few milliseconds, does not); from then on
//     every command sent to it fails at once with a *NodeHungError, which
//     the index wraps in ErrUnavailable, instead of waiting. On Cluster a
//     pipeline is split per node and every part passes its node's guard, so
//     a write flush or a lookup whose keys (or part of them) live on other
//     nodes is answered by those at their own speed: the hung node no
//     longer holds the one flush in flight (writer.go) and, through it,
//     every pod's writes.
//   - a probe PINGs the hung node (under CallTimeout, then again after
//     probeEvery); its first reply, an error reply included, clears the mark.
//     A node that is only slow is cleared by the first probe.
//   - on Cluster, every call failed by the guard or by a network error asks
//     go-redis to reload its slot map (at most every reloadEvery). go-redis
//     reloads by itself only on MOVED/ASK/READONLY replies, which a hung
//     node never sends: after the cluster promoted the hung master's
//     replica, the client would keep sending that master's slots to it
//     until it resumed. A reload asks CLUSTER SLOTS of the known nodes in
//     random order; a hung one fails at once through its guard, so the
//     reload is answered by a live node, and so is the synchronous reload
//     of ForEachMaster (Healthy, loss.go, expiry.go), which a hung node
//     would otherwise fail one time in N for as long as it stays listed.
//
// Clients built by New get a guard on every node; NewWithClient installs it
// on a single-node client and on the Cluster nodes the client creates after
// it (go-redis creates them lazily; call it before the client's first
// command). After Close the guards pass every command through.

const (
	probeEvery  = 100 * time.Millisecond
	reloadEvery = 250 * time.Millisecond
)

// NodeHungError is the error of a command the guard failed without
// sending it: its node timed out and has not answered since.
type NodeHungError struct {
	Addr string
}

func (e *NodeHungError) Error() string {
	return "node " + e.Addr + " not answering (a call to it timed out; calls fail at once until it answers a PING)"
}

// probeKey marks the probe's context: its PING passes the guard.
type probeKey struct{}

// nodeGuard guards one node client; see above.
type nodeGuard struct {
	x    *Index
	c    *redis.Client
	err  *NodeHungError
	hung atomic.Bool
}

// guard installs a nodeGuard on every node client of c.
func (x *Index) guard(c redis.UniversalClient) {
	add := func(n *redis.Client) {
		n.AddHook(&nodeGuard{x: x, c: n, err: &NodeHungError{Addr: n.Options().Addr}})
		if x.nodeHook != nil {
			if h := x.nodeHook(n.Options().Addr); h != nil {
				n.AddHook(h)
			}
		}
	}
	switch cc := c.(type) {
	case *redis.ClusterClient:
		cc.OnNewNode(add)
	case *redis.Client:
		add(cc)
	}
}

func (g *nodeGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *nodeGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.failFast(ctx) {
			return g.err
		}
		start := time.Now()
		err := next(ctx, cmd)
		g.after(ctx, start, err)
		return err
	}
}

func (g *nodeGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.failFast(ctx) {
			for _, c := range cmds {
				c.SetErr(g.err)
			}
			return g.err
		}
		start := time.Now()
		err := next(ctx, cmds)
		g.after(ctx, start, err)
		return err
	}
}

// failFast reports whether a command must fail without being sent: the
// node is marked hung and ctx is not the probe's.
func (g *nodeGuard) failFast(ctx context.Context) bool {
	if !g.hung.Load() || g.x.closed.Load() || ctx.Value(probeKey{}) != nil {
		return false
	}
	g.x.reloadTopology()
	return true
}

// after looks at a command's outcome: a network error may mean the slot
// map is stale (Cluster); a timeout after waiting long enough marks the
// node hung.
func (g *nodeGuard) after(ctx context.Context, start time.Time, err error) {
	if err == nil || !isNetworkError(err) || g.x.closed.Load() || ctx.Value(probeKey{}) != nil {
		return
	}
	g.x.reloadTopology()
	if isTimeout(err) && time.Since(start) >= g.x.callTimeout/2 && g.hung.CompareAndSwap(false, true) {
		g.x.log.Warn("redis node not answering: calls to it fail at once until it answers a PING",
			"node", g.err.Addr, "waited", time.Since(start).Round(time.Millisecond).String())
		g.x.probeNode(g)
	}
}

// isNetworkError: the command got no reply (a reply, even an error reply
// or a nil, proves the node answers).
func isNetworkError(err error) bool {
	if err == redis.Nil || errors.Is(err, context.Canceled) {
		return false
	}
	var re redis.Error
	return !errors.As(err, &re)
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// probeNode PINGs g's node until it answers, then clears its mark. It runs
// until the index closes or the node's client is closed (go-redis dropped
// the node from the cluster).
func (x *Index) probeNode(g *nodeGuard) {
	x.probeMu.Lock()
	defer x.probeMu.Unlock()
	if x.probesDone {
		g.hung.Store(false)
		return
	}
	x.probes.Add(1)
	go func() {
		defer x.probes.Done()
		ctx := context.WithValue(x.bgCtx, probeKey{}, true)
		for {
			pctx, cancel := context.WithTimeout(ctx, x.callTimeout)
			err := g.c.Ping(pctx).Err()
			cancel()
			if err == nil || !isNetworkError(err) {
				g.hung.Store(false)
				x.log.Info("redis node answering again", "node", g.err.Addr)
				x.reloadTopology()
				return
			}
			if errors.Is(err, redis.ErrClosed) || ctx.Err() != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(probeEvery):
			}
		}
	}()
}

// stopProbes makes probeNode start no more probes and waits for those
// running (Close).
func (x *Index) stopProbes() {
	x.probeMu.Lock()
	x.probesDone = true
	x.probeMu.Unlock()
	x.probes.Wait()
}

// reloadTopology asks go-redis to reload the Cluster slot map in the
// background, at most every reloadEvery; a no-op on a single node.
func (x *Index) reloadTopology() {
	cc, ok := x.c.(*redis.ClusterClient)
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	last := x.lastReload.Load()
	if now-last < int64(reloadEvery) || !x.lastReload.CompareAndSwap(last, now) {
		return
	}
	x.reloads.Add(1)
	cc.ReloadState(context.Background())
}
