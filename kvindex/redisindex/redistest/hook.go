package redistest

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips counts network round trips made by a go-redis client: one per
// single command and one per pipeline sent to one node. Connection setup and
// Cluster topology refreshes are not counted. Attach it with
// Attach BEFORE the client issues its first command (Cluster node clients
// are created lazily and only then receive the hook).
type RoundTrips struct {
	n atomic.Int64
}

// Attach installs the counter on c (on every node client for a Cluster).
func (r *RoundTrips) Attach(c redis.UniversalClient) { AddHook(c, r) }

// AddHook installs h on c, on every node client for a Cluster: like
// RoundTrips, call it before c issues its first command.
func AddHook(c redis.UniversalClient, h redis.Hook) {
	switch cc := c.(type) {
	case *redis.ClusterClient:
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	case *redis.Client:
		cc.AddHook(h)
	}
}

// Load returns the count so far.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

// Reset sets the count to zero.
func (r *RoundTrips) Reset() { r.n.Store(0) }

func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "cluster", "command", "hello", "client", "auth", "select", "readonly", "config":
			// Client bookkeeping (topology refresh, connection setup, the
			// index's background CONFIG GET of notify-keyspace-events),
			// issued on its own schedule, not per operation.
		default:
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}
