// Package leases divides a shared list of engine endpoints between several
// kvindexd daemons that share one Redis index (the connect topology, where
// daemons subscribe to engines), and makes a daemon that takes an endpoint
// over start it from a clean state (takeover.go).
//
// It talks to Redis directly through go-redis, under the index's namespace,
// rather than through redisindex: leases are a coordination protocol of
// their own (SET NX PX, compare-and-extend), not index data, and the only
// thing takeover needs from the index is ClearPodsNamed, taken as an
// interface. Keys (see redisindex's doc for the index's own):
//
//	<ns>:lease:<endpoint>       STRING daemon id, PX ttl          (who owns it)
//	<ns>:daemons                ZSET daemon id -> expiry (ms)     (who is alive)
//	<ns>:lease-pods:<endpoint>  SET pod names indexed from it     (takeover.go)
package leases

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Manager divides a shared list of engine endpoints between several
// daemons (the "connect" topology, where daemons subscribe to engines):
// every endpoint is subscribed by exactly one live daemon, via a lease held
// in Redis.
//
//	<ns>:lease:<endpoint>  STRING daemon id, PX ttl      (who owns it)
//	<ns>:daemons           ZSET daemon id -> expiry (ms) (who is alive)
//
// Every ttl/3 each daemon: heartbeats into the daemons set (server time, so
// daemon clocks do not matter) and reads how many daemons are alive; renews
// its leases (compare-and-extend in Lua: only if the value is still its id);
// gives up leases beyond its fair share ceil(endpoints/daemons) so a new
// daemon gets work; and takes free leases (SET if absent, or re-take its own)
// up to its share. A daemon that dies stops renewing: its leases expire
// after ttl and the others take its endpoints over. A daemon that cannot
// reach Redis drops (calls release for) its leases before they can expire,
// so two daemons never apply the same endpoint's events for long: at most
// one tick of overlap.
type Manager struct {
	client redis.UniversalClient
	ns     string
	id     string
	ttl    time.Duration
	tick   time.Duration
	log    *slog.Logger

	mu   sync.Mutex
	held map[string]time.Time // endpoint -> when the last successful renewal was sent
}

// NewManager makes a manager for daemonID (unique per daemon, e.g. pod
// name) with leases of ttl (minimum 300ms; typical 10s), under the index's
// namespace (redisindex.Index.Namespace).
func NewManager(c redis.UniversalClient, namespace, daemonID string, ttl time.Duration) *Manager {
	ttl = max(ttl, 300*time.Millisecond)
	return &Manager{
		client: c, ns: namespace, id: daemonID, ttl: ttl, tick: ttl / 3,
		log:  slog.Default(),
		held: map[string]time.Time{},
	}
}

// SetLogger replaces the logger (default slog.Default()).
func (m *Manager) SetLogger(l *slog.Logger) { m.log = l }

// Held lists the endpoints this daemon holds now.
func (m *Manager) Held() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for ep := range m.held {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}

var leaseAcquire = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

var leaseRenew = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

var leaseRelease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)

// heartbeat: ZADD self with expiry = server now + ttl, drop expired
// daemons, return how many are alive.
var leaseHeartbeat = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
`)

func (m *Manager) leaseKey(ep string) string { return endpointKey(m.ns, "lease", ep) }

// endpointKey is "<ns>:<kind>:<endpoint>" with '{', '}' and '%' %-escaped,
// so an endpoint address can never form a Redis Cluster hash tag.
func endpointKey(ns, kind, ep string) string {
	if strings.ContainsAny(ep, "{}%") {
		ep = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(ep)
	}
	return ns + ":" + kind + ":" + ep
}

// Run manages leases until ctx is done, then releases everything it holds
// (calling release for each) and returns. endpoints is called every tick and
// must return the full, shared endpoint list (the same on every daemon).
// acquire and release are called from Run's goroutine, one at a time; wire
// them to Takeover.Prepare + kvevents.Subscriber.AddEndpoint, and to
// RemoveEndpoint. An acquire that fails gives the lease back at once, so
// the endpoint is retried (by any daemon) at a later tick rather than held
// by a daemon that does not subscribe it.
func (m *Manager) Run(ctx context.Context, endpoints func() []string, acquire func(ctx context.Context, ep string) error, release func(ep string)) error {
	t := time.NewTicker(m.tick)
	defer t.Stop()
	for {
		m.step(ctx, endpoints(), acquire, release)
		select {
		case <-ctx.Done():
			m.releaseAll(release)
			return nil
		case <-t.C:
		}
	}
}

// step is one tick: heartbeat, renew what is held, then (Redis reachable)
// give back what left the list or exceeds the fair share, and take free
// endpoints up to it.
func (m *Manager) step(ctx context.Context, eps []string, acquire func(context.Context, string) error, release func(string)) {
	eps = slices.Compact(slices.Sorted(slices.Values(eps)))
	start := time.Now()
	live, err := leaseHeartbeat.Run(ctx, m.client, []string{m.ns + ":daemons"}, m.id, m.ttl.Milliseconds()).Int64()
	if err != nil {
		live = 0
	}
	m.renew(ctx, start, release)
	if live == 0 {
		return // Redis unreachable: take nothing new.
	}
	share := int(math.Ceil(float64(len(eps)) / float64(live)))
	if m.giveBack(ctx, eps, share, release) {
		return
	}
	m.takeFree(ctx, eps, share, start, acquire)
}

// renew extends every held lease (one pipeline) and drops the endpoints
// whose lease another daemon has, or that could not be renewed for so long
// that the lease may expire in Redis before the next tick.
func (m *Manager) renew(ctx context.Context, start time.Time, release func(string)) {
	held := m.Held()
	if len(held) == 0 {
		return
	}
	ttlMS := m.ttl.Milliseconds()
	pipe := m.client.Pipeline()
	cmds := make([]*redis.Cmd, len(held))
	for i, ep := range held {
		cmds[i] = leaseRenew.EvalSha(ctx, pipe, []string{m.leaseKey(ep)}, m.id, ttlMS)
	}
	_, _ = pipe.Exec(ctx)
	for i, ep := range held {
		n, err := cmds[i].Int64()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			n, err = leaseRenew.Run(ctx, m.client, []string{m.leaseKey(ep)}, m.id, ttlMS).Int64()
		}
		switch {
		case err == nil && n == 1:
			m.mu.Lock()
			m.held[ep] = start
			m.mu.Unlock()
		case err == nil:
			m.log.Warn("lease lost to another daemon", "endpoint", ep, "daemon", m.id)
			m.drop(ep, release)
		default:
			m.mu.Lock()
			last := m.held[ep]
			m.mu.Unlock()
			// Give the endpoint up before the lease can expire in Redis
			// and be taken by someone else.
			if time.Since(last) > m.ttl-m.tick {
				m.log.Warn("lease not renewable (redis unreachable), releasing endpoint", "endpoint", ep, "daemon", m.id, "err", err)
				m.drop(ep, release)
			}
		}
	}
}

// giveBack releases the endpoints that left the list, then those beyond
// share (a daemon joined). It reports whether this daemon was over its
// share, in which case it takes nothing this tick.
func (m *Manager) giveBack(ctx context.Context, eps []string, share int, release func(string)) bool {
	for _, ep := range m.Held() {
		if _, ok := slices.BinarySearch(eps, ep); !ok {
			m.releaseOne(ctx, ep, release)
		}
	}
	cur := m.Held()
	if len(cur) <= share {
		return false
	}
	for _, ep := range cur[share:] {
		m.releaseOne(ctx, ep, release)
	}
	return true
}

// takeFree acquires free endpoints until this daemon holds share, starting
// at a daemon-specific offset so that daemons starting together do not race
// for the same ones.
func (m *Manager) takeFree(ctx context.Context, eps []string, share int, start time.Time, acquire func(context.Context, string) error) {
	n := len(m.Held())
	if n >= share || len(eps) == 0 {
		return
	}
	h := fnv.New32a()
	h.Write([]byte(m.id))
	off := int(h.Sum32() % uint32(len(eps)))
	for i := 0; i < len(eps) && n < share; i++ {
		ep := eps[(off+i)%len(eps)]
		m.mu.Lock()
		_, mine := m.held[ep]
		m.mu.Unlock()
		if mine {
			continue
		}
		ok, err := leaseAcquire.Run(ctx, m.client, []string{m.leaseKey(ep)}, m.id, m.ttl.Milliseconds()).Int64()
		if err != nil {
			return
		}
		if ok != 1 {
			continue
		}
		if err := acquire(ctx, ep); err != nil {
			m.log.Warn("lease acquired but the endpoint could not be taken over; giving it back", "endpoint", ep, "daemon", m.id, "err", err)
			if err := leaseRelease.Run(ctx, m.client, []string{m.leaseKey(ep)}, m.id).Err(); err != nil {
				m.log.Warn("lease release failed; it will expire", "endpoint", ep, "err", err)
			}
			continue
		}
		m.mu.Lock()
		m.held[ep] = start
		m.mu.Unlock()
		n++
		m.log.Info("lease acquired", "endpoint", ep, "daemon", m.id)
	}
}

// drop forgets ep locally and calls release.
func (m *Manager) drop(ep string, release func(string)) {
	m.mu.Lock()
	_, ok := m.held[ep]
	delete(m.held, ep)
	m.mu.Unlock()
	if ok {
		release(ep)
	}
}

// releaseOne stops using ep, then deletes the lease if it is still ours.
// Stop first: once the key is gone another daemon may start on it.
func (m *Manager) releaseOne(ctx context.Context, ep string, release func(string)) {
	m.drop(ep, release)
	if err := leaseRelease.Run(ctx, m.client, []string{m.leaseKey(ep)}, m.id).Err(); err != nil && !errors.Is(err, context.Canceled) {
		m.log.Warn("lease release failed; it will expire", "endpoint", ep, "err", err)
	}
}

func (m *Manager) releaseAll(release func(string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, ep := range m.Held() {
		m.releaseOne(ctx, ep, release)
	}
	_ = m.client.ZRem(ctx, m.ns+":daemons", m.id).Err()
}
