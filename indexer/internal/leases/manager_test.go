package leases

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

// owners tracks which manager subscribed to which endpoint, as a kvevents
// Subscriber would, and records any moment where two own the same one.
type owners struct {
	mu       sync.Mutex
	by       map[string]string
	overlaps []string
	acquired map[string]int
}

func newOwners() *owners { return &owners{by: map[string]string{}, acquired: map[string]int{}} }

func (o *owners) acquire(who string) func(context.Context, string) error {
	return func(_ context.Context, ep string) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if cur, ok := o.by[ep]; ok && cur != who {
			o.overlaps = append(o.overlaps, fmt.Sprintf("%s acquired %s held by %s", who, ep, cur))
		}
		o.by[ep] = who
		o.acquired[who]++
		return nil
	}
}

func (o *owners) release(who string) func(string) {
	return func(ep string) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.by[ep] == who {
			delete(o.by, ep)
		}
	}
}

// forget drops every endpoint of who (a crashed daemon's subscriptions die
// with it).
func (o *owners) forget(who string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for ep, w := range o.by {
		if w == who {
			delete(o.by, ep)
		}
	}
}

func (o *owners) snapshot() map[string][]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]string{}
	for ep, w := range o.by {
		out[w] = append(out[w], ep)
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

func TestLeaseTakeover(t *testing.T) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, DisableIdentity: true})
	defer c.Close()
	ns := redistest.UniqueNS(t)
	eps := []string{"tcp://10.0.0.1:5557", "tcp://10.0.0.2:5557", "tcp://10.0.0.3:5557", "tcp://10.0.0.4:5557", "tcp://10.0.0.5:5557"}
	list := func() []string { return eps }
	own := newOwners()
	const ttl = 1500 * time.Millisecond // generous: a loaded 2-core CI box must renew in time

	run := func(m *Manager, who string) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx, list, own.acquire(who), own.release(who)) }()
		return func() { cancel(); <-done }
	}

	// a has a client of its own: closing it is how a dies (it can no
	// longer renew, release or delete anything in Redis).
	ca := newClient(s)
	a := NewManager(ca, ns, "daemon-a", ttl)
	a.SetLogger(quiet)
	stopA := run(a, "a")
	wait.For(t, "a holds all endpoints", func() bool { return len(own.snapshot()["a"]) == len(eps) })

	// A second daemon joins: the endpoints are split 3/2, disjointly.
	b := NewManager(c, ns, "daemon-b", ttl)
	b.SetLogger(quiet)
	stopB := run(b, "b")
	wait.For(t, "split between a and b", func() bool {
		s := own.snapshot()
		return len(s["a"])+len(s["b"]) == len(eps) && len(s["a"]) >= 2 && len(s["b"]) >= 2
	})
	if got, want := len(a.Held())+len(b.Held()), len(eps); got != want {
		t.Fatalf("held %v + %v, want %d endpoints", a.Held(), b.Held(), want)
	}
	for _, ep := range a.Held() {
		if v, _ := c.Get(context.Background(), ns+":lease:"+ep).Result(); v != "daemon-a" {
			t.Fatalf("lease of %s in redis = %q, want daemon-a", ep, v)
		}
	}

	// A dies without releasing anything: after the lease TTL, B takes over
	// every endpoint.
	ca.Close()
	stopA()
	own.forget("a")
	wait.For(t, "b takes over all endpoints", func() bool { return len(own.snapshot()["b"]) == len(eps) })

	// A third daemon joins and leaves gracefully: its endpoints come back to
	// B without waiting for a TTL (it deletes its leases).
	cM := NewManager(c, ns, "daemon-c", ttl)
	cM.SetLogger(quiet)
	stopC := run(cM, "c")
	wait.For(t, "c gets a share", func() bool { return len(own.snapshot()["c"]) >= 2 })
	stopC()
	if n, _ := c.Exists(context.Background(), leaseKeysOf(ns, eps)...).Result(); n != int64(len(b.Held())) {
		t.Fatalf("after c's graceful stop %d lease keys exist, b holds %v", n, b.Held())
	}
	wait.For(t, "b takes c's endpoints back", func() bool { return len(own.snapshot()["b"]) == len(eps) })

	// The endpoint list shrinks: the lease of a removed endpoint is released.
	stopB()
	if n, _ := c.Exists(context.Background(), leaseKeysOf(ns, eps)...).Result(); n != 0 {
		t.Fatalf("after b's graceful stop %d lease keys remain", n)
	}
	own.mu.Lock()
	defer own.mu.Unlock()
	if len(own.overlaps) > 0 {
		t.Fatalf("an endpoint had two owners: %v", own.overlaps)
	}
}

var quiet = slog.New(slog.DiscardHandler)

func newClient(s *redistest.Server) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, DisableIdentity: true})
}

func leaseKeysOf(ns string, eps []string) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		out[i] = ns + ":lease:" + ep
	}
	return out
}

func TestLeaseEndpointRemovedAndRedisLoss(t *testing.T) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, DisableIdentity: true,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	ns := redistest.UniqueNS(t)
	var mu sync.Mutex
	eps := []string{"e1", "e2", "e3"}
	list := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(eps) }
	own := newOwners()
	m := NewManager(c, ns, "d", 1500*time.Millisecond)
	m.SetLogger(quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx, list, own.acquire("d"), own.release("d")) }()
	defer func() { cancel(); <-done }()
	wait.For(t, "all held", func() bool { return len(own.snapshot()["d"]) == 3 })

	mu.Lock()
	eps = []string{"e1", "e3"}
	mu.Unlock()
	wait.For(t, "e2 released", func() bool { return slices.Equal(own.snapshot()["d"], []string{"e1", "e3"}) })
	if n, _ := c.Exists(context.Background(), ns+":lease:e2").Result(); n != 0 {
		t.Fatal("lease key of removed endpoint still exists")
	}

	// Redis lost: the daemon must stop using its endpoints (it can no longer
	// prove it owns them), and take them again once Redis is back.
	s.Kill()
	wait.For(t, "endpoints released while redis is down", func() bool { return len(own.snapshot()["d"]) == 0 })
	s.Restart()
	wait.For(t, "endpoints re-acquired", func() bool { return len(own.snapshot()["d"]) == 2 })
}

// An endpoint whose takeover fails is not held: its lease is given back at
// once (any daemon may retry it at a later tick), and the other endpoints
// are unaffected.
func TestLeaseAcquireFailureGivesTheLeaseBack(t *testing.T) {
	s := redistest.Start(t)
	c := newClient(s)
	defer c.Close()
	ns := redistest.UniqueNS(t)
	var mu sync.Mutex
	tries := 0
	m := NewManager(c, ns, "d", 3*time.Second)
	m.SetLogger(quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(ctx, func() []string { return []string{"bad", "good"} }, func(_ context.Context, ep string) error {
			if ep != "bad" {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			tries++
			return fmt.Errorf("clearing the previous owner's pods failed")
		}, func(string) {})
	}()
	wait.For(t, "bad retried at a later tick", func() bool { mu.Lock(); defer mu.Unlock(); return tries >= 2 })
	if held := m.Held(); !slices.Equal(held, []string{"good"}) {
		t.Fatalf("held %v, want only good", held)
	}
	// Stop the manager so no attempt is in flight, then look: a lease kept
	// after a failed takeover would still be there (it lives for the TTL).
	cancel()
	<-done
	if n, err := c.Exists(context.Background(), ns+":lease:bad").Result(); err != nil || n != 0 {
		t.Fatalf("lease of the failed endpoint exists (%d, %v): it should be given back", n, err)
	}
}
