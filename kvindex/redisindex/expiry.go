package redisindex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counting TTL expirations (see doc.go, "TTL expirations"): one watcher per
// Redis node that holds block keys (the single node, or every Cluster
// master: keyspace events are local to the node that expires the key)
// subscribes to __keyevent@<db>__:expired and counts the expired keys that
// are block keys of our namespace. The operator's configuration is never
// changed: when notify-keyspace-events lacks the flags, the watcher logs a
// warning once and only re-checks now and then.

// Timings of the expiry watchers (variables so tests can shorten them).
var (
	// expiryRecheck: how often a node whose notifications are off (or
	// whose PSUBSCRIBE was refused) is checked again.
	expiryRecheck = 30 * time.Second
	// expiryIdlePing: a subscription silent for this long is PINGed; one
	// still silent after another period is considered dead and redone.
	expiryIdlePing = 30 * time.Second
	// expiryTopology: how often the Cluster masters are re-listed.
	expiryTopology = 5 * time.Second
	// expiryBackoffMin/Max bound the retry delay while a node is
	// unreachable.
	expiryBackoffMin = 100 * time.Millisecond
	expiryBackoffMax = 5 * time.Second
)

// notifyFlagsNeeded is what an operator has to enable (see the warning).
const notifyFlagsNeeded = "Ex"

// expiredEventsOn reports whether a notify-keyspace-events value makes Redis
// publish __keyevent@<db>__:expired: E (keyevent channel class) and x
// (expired events; A is an alias that includes x).
func expiredEventsOn(flags string) bool {
	return strings.ContainsRune(flags, 'E') && strings.ContainsAny(flags, "xA")
}

// isBlockKey reports whether key is "<prefix><model>:<16 hex digits>", i.e.
// a block key of our namespace (prefix is "<ns>:b:").
func isBlockKey(key, prefix string) bool {
	if len(key) < len(prefix)+17 || !strings.HasPrefix(key, prefix) {
		return false
	}
	tail := key[len(key)-17:]
	if tail[0] != ':' {
		return false
	}
	for i := 1; i < len(tail); i++ {
		if c := tail[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// startExpiryWatch starts the watcher(s); they stop when ctx is cancelled
// (Close) and Close waits for them. Nothing to count without a TTL.
func (x *Index) startExpiryWatch(ctx context.Context) {
	if x.ttlMS == 0 {
		return
	}
	switch c := x.c.(type) {
	case *redis.ClusterClient:
		x.watchers.Add(1)
		go func() {
			defer x.watchers.Done()
			x.watchCluster(ctx, c)
		}()
	case *redis.Client:
		x.watchers.Add(1)
		go func() {
			defer x.watchers.Done()
			x.watchNode(ctx, c, c.Options().DB)
		}()
	default:
		x.log.Info("redisindex: TTL expirations of block keys are not counted with this client type", "client", fmt.Sprintf("%T", x.c))
	}
}

// watchCluster keeps one node watcher per current master: masters are
// re-listed every expiryTopology (failover, resharding, a client that
// learns the slots late), new ones get a watcher, former ones lose theirs.
func (x *Index) watchCluster(ctx context.Context, cc *redis.ClusterClient) {
	type nodeWatch struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	nodes := map[string]*nodeWatch{}
	stopNode := func(addr string) {
		n := nodes[addr]
		n.cancel()
		<-n.done
		delete(nodes, addr)
	}
	defer func() {
		for addr := range nodes {
			stopNode(addr)
		}
	}()
	backoff := expiryBackoffMin
	for {
		var mu sync.Mutex
		masters := map[string]*redis.Client{}
		err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			masters[c.Options().Addr] = c
			mu.Unlock()
			return nil
		})
		wait := expiryTopology
		if err != nil || len(masters) == 0 {
			// Cluster unreachable or slots not known yet: keep the
			// current watchers, retry soon.
			wait, backoff = backoff, min(backoff*2, expiryBackoffMax)
		} else {
			backoff = expiryBackoffMin
			for addr, c := range masters {
				if nodes[addr] != nil {
					continue
				}
				nctx, cancel := context.WithCancel(ctx)
				n := &nodeWatch{cancel: cancel, done: make(chan struct{})}
				nodes[addr] = n
				go func() {
					defer close(n.done)
					x.watchNode(nctx, c, 0) // Cluster has db 0 only
				}()
			}
			for addr := range nodes {
				if masters[addr] == nil {
					stopNode(addr)
				}
			}
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// watchNode counts the expirations of one node until ctx ends. Each
// (re)connection starts with a check of notify-keyspace-events, so a Redis
// restarted with other settings is noticed.
func (x *Index) watchNode(ctx context.Context, c *redis.Client, db int) {
	addr := c.Options().Addr
	backoff := expiryBackoffMin
	retry := func() bool {
		ok := sleepCtx(ctx, backoff)
		backoff = min(backoff*2, expiryBackoffMax)
		return ok
	}
	for ctx.Err() == nil {
		flags, err := notifyFlags(ctx, c)
		switch {
		case err != nil && (!isServerError(err) || redis.IsLoadingError(err)):
			// Unreachable (or loading): try again.
			if !retry() {
				return
			}
			continue
		case err != nil:
			// CONFIG refused (managed Redis, ACL, renamed command): the
			// setting cannot be read, so subscribe anyway; events arrive
			// only if the provider enabled them.
			if !x.warnedUnreadable.Swap(true) {
				x.log.Info("redisindex: cannot read notify-keyspace-events; subscribing to expired-key events anyway: TTL expirations of block keys are counted only if the server has notify-keyspace-events "+notifyFlagsNeeded+" (E and x) enabled",
					"node", addr, "error", err.Error())
			}
		case !expiredEventsOn(flags):
			if !x.warnedOff.Swap(true) {
				x.log.Warn("redisindex: Redis keyspace notifications for expired keys are off, so TTL expirations of block keys cannot be counted (Stats().Expired misses them); to count them, set notify-keyspace-events "+notifyFlagsNeeded+" on the server (or add E and x to its current flags)",
					"node", addr, "notify-keyspace-events", flags)
			}
			backoff = expiryBackoffMin
			if !sleepCtx(ctx, expiryRecheck) {
				return
			}
			continue
		}
		subscribed, err := x.countExpired(ctx, c, db)
		if ctx.Err() != nil {
			return
		}
		if subscribed {
			backoff = expiryBackoffMin
		}
		if isServerError(err) && !redis.IsLoadingError(err) {
			// PSUBSCRIBE refused (ACL channel permissions).
			if !x.warnedNoSubscr.Swap(true) {
				x.log.Warn("redisindex: cannot subscribe to expired-key events, so TTL expirations of block keys cannot be counted",
					"node", addr, "error", err.Error())
			}
			if !sleepCtx(ctx, expiryRecheck) {
				return
			}
			continue
		}
		if !retry() {
			return
		}
	}
}

// notifyFlags reads notify-keyspace-events from one node.
func notifyFlags(ctx context.Context, c *redis.Client) (string, error) {
	m, err := c.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return "", err
	}
	v, ok := m["notify-keyspace-events"]
	if !ok {
		return "", serverError("CONFIG GET notify-keyspace-events returned nothing")
	}
	return v, nil
}

// countExpired subscribes to the node's expired-key events and counts our
// block keys until the connection fails or ctx ends. subscribed reports
// whether Redis confirmed the subscription (the connection worked).
func (x *Index) countExpired(ctx context.Context, c *redis.Client, db int) (subscribed bool, err error) {
	ps := c.PSubscribe(ctx) // no pattern yet: no I/O
	// Close unblocks a Receive in progress when ctx ends; wait for that
	// close to finish so no goroutine outlives the watcher.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = ps.Close(); close(closed) })
	defer func() {
		if stop() {
			_ = ps.Close()
		} else {
			<-closed
		}
	}()
	if err := ps.PSubscribe(ctx, "__keyevent@"+strconv.Itoa(db)+"__:expired"); err != nil {
		return false, err
	}
	prefix := x.ns + ":b:"
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, expiryIdlePing)
		if err != nil {
			if ctx.Err() != nil {
				return subscribed, ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				// Silent for a while: make sure the connection is alive
				// (a half-open one would never report an error).
				pinged = true
				if err := ps.Ping(ctx); err != nil {
					return subscribed, err
				}
				continue
			}
			return subscribed, err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			subscribed = true
		case *redis.Message:
			if isBlockKey(m.Payload, prefix) {
				x.ttlExpired.Add(1)
			}
		}
	}
}

// serverError is an answer from Redis that is not what we asked for: like a
// refusal, retrying does not help.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// sleepCtx waits d or until ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
