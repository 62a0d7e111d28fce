package redisindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// Index is the Redis-backed kvindex.Index (see doc.go for the schema). It is
// safe for concurrent use by any number of goroutines and daemons.
type Index struct {
	c          redis.UniversalClient
	cluster    bool
	serverWalk bool // single node + Config.ServerWalk: lookups use lookupScript
	ns         string
	ttlMS      int64
	in         *kvindex.Interner
	podsKey    string

	// epochs is this process' copy of the pods hash: every pod's current
	// epoch and the version (_v) it was read at. The map is never mutated
	// once published (copy on write), so readers may use it unlocked.
	emu     sync.RWMutex
	eLoaded bool
	eVer    string
	epochs  map[kvindex.PodID]uint64

	// name caches: PodID -> "<rank>.<name>", holder -> field, model -> key
	// prefix, field -> holder. All grow with the fleet only (pods x tiers x
	// groups, models), never with blocks; fields is bounded anyway because
	// it is filled from data read out of Redis.
	nmu      sync.RWMutex
	podField map[kvindex.PodID]string
	holderF  map[kvindex.Holder]string
	modelPfx map[kvindex.ModelID]string
	fields   map[string]kvindex.Holder

	cleanup chan cleanupItem

	// callTimeout bounds every operation as a whole (Config.CallTimeout);
	// loss watches for a Redis that lost entries (loss.go), lost counts
	// what it found.
	callTimeout time.Duration
	loss        lossWatch
	lost        atomic.Int64

	// nodeHook is Config.NodeHook (guard.go installs it per node).
	nodeHook func(addr string) redis.Hook

	// hung-node guards (guard.go): the probes of hung nodes, and when the
	// Cluster slot map was last reloaded because of a failed call.
	probeMu             sync.Mutex
	probesDone          bool
	probes              sync.WaitGroup
	lastReload, reloads atomic.Int64

	// write coalescing (writer.go)
	wc              committer
	wReqs, wFlushes atomic.Int64

	entries, keys, expired atomic.Int64
	malformed              atomic.Int64
	// ttlExpired counts block keys Redis expired (keyspace notifications,
	// see expiry.go); warned* make each expiry-watcher warning log once.
	ttlExpired                                  atomic.Int64
	warnedOff, warnedUnreadable, warnedNoSubscr atomic.Bool

	log        *slog.Logger
	bgCtx      context.Context // canceled by Close
	stop       context.CancelFunc
	done       chan struct{}
	watchers   sync.WaitGroup // expiry watchers (expiry.go)
	closed     atomic.Bool
	ownsClient bool
}

type cleanupItem struct {
	key, field, value string
}

const maxFieldCache = 1 << 16

var _ kvindex.Index = (*Index)(nil)
var _ kvindex.HealthChecker = (*Index)(nil)
var _ kvindex.PodBlocksBatcher = (*Index)(nil)

// New connects to Redis as configured. It does not fail when Redis is down:
// Healthy reports the problem, operations return errors wrapping
// ErrUnavailable, and go-redis reconnects by itself when Redis is back. It
// fails only on a configuration error.
func New(ctx context.Context, cfg Config) (*Index, error) {
	if cfg.Interner == nil {
		return nil, errors.New("redisindex: Config.Interner is required")
	}
	o, err := cfg.universalOptions()
	if err != nil {
		return nil, fmt.Errorf("redisindex: %s: %w", redactURL(cfg.URL), err)
	}
	cfg.ServerWalk, cfg.CallTimeout, cfg.LossCheck = o.serverWalk, o.callTimeout, o.lossCheck
	x := newIndex(o.client(), o.cluster, o.namespace, o.ttl, cfg)
	// Best effort: warm the epoch cache and script cache now so the first
	// request does not pay for it. Failure is not an error (Redis may come
	// up later).
	wctx, cancel := context.WithTimeout(ctx, orDur(cfg.DialTimeout, DefaultDialTimeout)+orDur(cfg.ReadTimeout, DefaultIOTimeout))
	_ = x.refresh(wctx)
	cancel()
	return x, nil
}

// NewWithClient wraps an existing client (tests, or a daemon sharing one
// client between the index and the lease manager). Close does not close it.
// The hung-node guard (guard.go) covers the Cluster nodes the client creates
// after this call: give it a client that has sent nothing yet.
func NewWithClient(c redis.UniversalClient, cfg Config) (*Index, error) {
	if cfg.Interner == nil {
		return nil, errors.New("redisindex: Config.Interner is required")
	}
	if err := checkDurations(cfg.CallTimeout, cfg.LossCheck); err != nil {
		return nil, fmt.Errorf("redisindex: %w", err)
	}
	ns, ttl, err := cfg.namespaceAndTTL(DefaultNamespace, DefaultTTL)
	if err != nil {
		return nil, fmt.Errorf("redisindex: %w", err)
	}
	_, isCluster := c.(*redis.ClusterClient)
	x := newIndex(c, isCluster, ns, ttl, cfg)
	x.ownsClient = false
	return x, nil
}

func newIndex(c redis.UniversalClient, cluster bool, ns string, ttl time.Duration, cfg Config) *Index {
	q := cfg.CleanupQueue
	if q <= 0 {
		q = 1 << 16
	}
	x := &Index{
		c: c, cluster: cluster, ns: ns, in: cfg.Interner,
		podsKey:  ns + ":pods",
		epochs:   map[kvindex.PodID]uint64{},
		podField: map[kvindex.PodID]string{},
		holderF:  map[kvindex.Holder]string{},
		modelPfx: map[kvindex.ModelID]string{},
		fields:   map[string]kvindex.Holder{},
		cleanup:  make(chan cleanupItem, q),
		done:     make(chan struct{}),
		log:      cfg.Logger,
		loss:     lossWatch{runID: map[string]string{}, evicted: map[string]int64{}},

		callTimeout: orDur(cfg.CallTimeout, DefaultCallTimeout),
		nodeHook:    cfg.NodeHook,
	}
	if x.log == nil {
		x.log = slog.Default()
	}
	x.ownsClient = true
	x.serverWalk = cfg.ServerWalk && !cluster
	if ttl > 0 {
		x.ttlMS = max(ttl.Milliseconds(), 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.bgCtx, x.stop = ctx, cancel
	x.guard(c) // before anything is sent: Cluster nodes get it as they are created
	go x.background(ctx, orDur(cfg.StatsRefresh, DefaultStatsRefresh))
	x.startExpiryWatch(ctx)
	if every := orDur(cfg.LossCheck, DefaultLossCheck); every > 0 {
		x.watchers.Add(1)
		go x.watchLoss(ctx, every)
	}
	return x
}

// Close stops the background work and closes the client (if New made it).
func (x *Index) Close() error {
	if x.closed.Swap(true) {
		return nil
	}
	x.stop()
	<-x.done
	x.watchers.Wait()
	x.stopProbes()
	if x.ownsClient {
		return x.c.Close()
	}
	return nil
}

// callCtx bounds one operation, all its round trips and retries, by
// CallTimeout (or the caller's earlier deadline): go-redis' per-attempt
// read timeout alone lets a retry after a timeout wait again, so a node
// asleep for 2 s answered a call after 1.97 s with a 1 s read timeout.
func (x *Index) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, x.callTimeout)
}

// Client is the underlying go-redis client (shared with the lease manager).
func (x *Index) Client() redis.UniversalClient { return x.c }

// Namespace is the key prefix in use.
func (x *Index) Namespace() string { return x.ns }

// Healthy pings Redis (every master in Cluster mode).
func (x *Index) Healthy(ctx context.Context) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	var err error
	if cc, ok := x.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
		if err == nil {
			// ForEachMaster succeeds vacuously before the slots are known.
			err = cc.Ping(ctx).Err()
		}
	} else {
		err = x.c.Ping(ctx).Err()
	}
	if err != nil {
		return unavailable("health", err)
	}
	return nil
}

// ---- names -------------------------------------------------------------

// Stats returns counters refreshed in the background (Entries, Keys) and
// counted locally: Expired is the stale entries this process found and
// deleted plus the block keys Redis expired by their TTL
// (TTLExpirations).
func (x *Index) Stats() kvindex.IndexStats {
	return kvindex.IndexStats{
		Entries: x.entries.Load(),
		Keys:    x.keys.Load(),
		Expired: x.expired.Load() + x.ttlExpired.Load(),
	}
}

// TTLExpirations is the number of block keys of this namespace that Redis
// removed because their TTL fired, as seen by this process through keyspace
// notifications (every daemon sharing the namespace sees every expiration).
// It stays 0 when the server's notify-keyspace-events lacks E and x (a
// warning is logged at start). Included in Stats().Expired.
func (x *Index) TTLExpirations() int64 { return x.ttlExpired.Load() }

// Malformed counts entries read from Redis that this version cannot parse
// (written by a foreign or newer writer); they are ignored.
func (x *Index) Malformed() int64 { return x.malformed.Load() }
