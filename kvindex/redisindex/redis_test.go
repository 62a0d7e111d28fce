package redisindex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

func TestParseIndexFlag(t *testing.T) {
	good := []struct {
		in      string
		memory  bool
		cluster bool
		addrs   string
		ns      string
		ttl     time.Duration
		tls     bool
		db      int
		pass    string
		walk    bool
	}{
		{in: "", memory: true},
		{in: "memory", memory: true},
		{in: "redis://127.0.0.1:6380/2", addrs: "127.0.0.1:6380", ns: "kvindex", ttl: DefaultTTL, db: 2},
		{in: "redis://:s3cret@h:1?namespace=prod&ttl=1h", addrs: "h:1", ns: "prod", ttl: time.Hour, pass: "s3cret"},
		{in: "rediss://h:6380", addrs: "h:6380", ns: "kvindex", ttl: DefaultTTL, tls: true},
		{in: "redis://h:1?ttl=0", addrs: "h:1", ns: "kvindex", ttl: -1},
		{in: "redis-cluster://h1:7000,h2:7001", cluster: true, addrs: "h1:7000,h2:7001", ns: "kvindex", ttl: DefaultTTL},
		{in: "redis-cluster://:pw@h1:7000,h2:7001?tls=true&namespace=x&dial_timeout=2s", cluster: true, addrs: "h1:7000,h2:7001", ns: "x", ttl: DefaultTTL, tls: true, pass: "pw"},
		{in: "rediss-cluster://h1:7000/", cluster: true, addrs: "h1:7000", ns: "kvindex", ttl: DefaultTTL, tls: true},
		{in: "redis://h:1?server_walk=true", addrs: "h:1", ns: "kvindex", ttl: DefaultTTL, walk: true},
	}
	for _, g := range good {
		f, err := ParseIndexFlag(g.in)
		if err != nil {
			t.Errorf("ParseIndexFlag(%q): %v", g.in, err)
			continue
		}
		if f.Memory != g.memory {
			t.Errorf("%q: Memory = %v", g.in, f.Memory)
		}
		if g.memory {
			continue
		}
		o, err := f.Redis.universalOptions()
		if err != nil {
			t.Fatal(err)
		}
		if o.cluster != g.cluster || o.namespace != g.ns || o.ttl != g.ttl || o.serverWalk != g.walk {
			t.Errorf("%q: cluster=%v ns=%q ttl=%v", g.in, o.cluster, o.namespace, o.ttl)
		}
		var addrs, pass string
		var hasTLS bool
		if o.cluster {
			addrs, pass, hasTLS = fmt.Sprint(joinComma(o.clusterOp.Addrs)), o.clusterOp.Password, o.clusterOp.TLSConfig != nil
		} else {
			addrs, pass, hasTLS = o.single.Addr, o.single.Password, o.single.TLSConfig != nil
			if o.single.DB != g.db {
				t.Errorf("%q: db = %d", g.in, o.single.DB)
			}
		}
		if addrs != g.addrs || pass != g.pass || hasTLS != g.tls {
			t.Errorf("%q: addrs=%q pass=%q tls=%v", g.in, addrs, pass, hasTLS)
		}
	}
	for _, bad := range []string{
		"mem", "http://h:1", "redis://", "redis://h:1?bogus=1", "redis-cluster://", "redis-cluster://h1",
		"redis-cluster://h1:99999", "redis-cluster://h1:1/3", "redis://h:1?namespace={x}", "redis://h:1?ttl=soon",
		"redis-cluster://h:1?bogus=1",
	} {
		if _, err := ParseIndexFlag(bad); err == nil {
			t.Errorf("ParseIndexFlag(%q): no error", bad)
		}
	}
	// Passwords never appear in errors.
	if _, err := ParseIndexFlag("redis://:hunter2@h:1?bogus=1"); err == nil || contains(err.Error(), "hunter2") {
		t.Errorf("error leaks password or is nil: %v", err)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

func contains(s, sub string) bool {
	return len(sub) > 0 && len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0)
}
func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

type countVisits struct{ n int }

func (c *countVisits) Visit(int, blockkeys.Key, []kvindex.Holder) bool { c.n++; return true }

func seqKeys(n int, base uint64) []blockkeys.Key {
	out := make([]blockkeys.Key, n)
	for i := range out {
		out[i] = blockkeys.Key(base + uint64(i))
	}
	return out
}

// Two daemons (two Index values, two interners) share one Redis: what one
// writes the other reads under its own ids; a clear by one is seen by the
// other at its next lookup; a write with a stale epoch cache is redone.
func TestTwoDaemonsShareIndex(t *testing.T) {
	t.Run("pipeline", func(t *testing.T) { testTwoDaemons(t, false) })
	t.Run("server-walk", func(t *testing.T) { testTwoDaemons(t, true) })
}

func testTwoDaemons(t *testing.T, walk bool) {
	s := redistest.Start(t)
	ns := redistest.UniqueNS(t)
	mk := func() (*Index, *kvindex.Interner) {
		return newTestIndex(t, s.URL(), func(c *Config) { c.Namespace = ns; c.ServerWalk = walk })
	}
	d1, in1 := mk()
	d2, in2 := mk()
	in2.Pod("unrelated", 0) // make the two interners assign different ids
	ctx := context.Background()
	m1, p1 := in1.Model("llama"), in1.Pod("pod-a", 3)
	if err := d1.Add(ctx, m1, p1, event.TierCPU, seqKeys(4, 100)); err != nil {
		t.Fatal(err)
	}
	m2 := in2.Model("llama")
	got := indextest.Lookup(t, d2, m2, seqKeys(5, 100), -1)
	p2, ok := in2.LookupPod("pod-a", 3)
	if !ok || len(got) != 4 || got[3].Holders[0] != (kvindex.Holder{Pod: p2, Tier: event.TierCPU}) {
		t.Fatalf("daemon 2 sees %v (pod-a/3 = %d %v)", got, p2, ok)
	}
	// d2 clears the pod; d1's cached epoch is now behind.
	if err := d2.ClearPod(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, d1, m1, seqKeys(4, 100), -1); len(got) != 0 {
		t.Fatalf("daemon 1 still sees cleared pod: %v", got)
	}
	// d1 adds for the pod again with whatever epoch it has: visible to both.
	if err := d1.Add(ctx, m1, p1, event.TierGPU, seqKeys(2, 100)); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, d2, m2, seqKeys(4, 100), -1); len(got) != 2 {
		t.Fatalf("after re-add daemon 2 sees %v", got)
	}
	if n, _ := d2.PodBlocks(ctx, p2); n != 2 {
		t.Fatalf("PodBlocks = %d, want 2", n)
	}

	// The stale entries (pre-clear CPU ones) were queued for cleanup by the
	// lookups above; they are compare-and-deleted and counted as Expired.
	// The pipeline path reads every key and queues all 4 stale entries; the
	// server walk deletes them on the spot as far as it walks (keys
	// 100..102; 103 is past the first miss and left to the TTL).
	cleaned := 4
	if walk {
		cleaned = 3
	}
	wait.For(t, "stale entries cleaned", func() bool { return d1.Stats().Expired+d2.Stats().Expired == int64(cleaned) })
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	for i := range cleaned {
		k := fmt.Sprintf("%s:b:llama:%016x", ns, 100+i)
		fields, err := recordFields(c.Get(ctx, k).Result())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if f != "0.0.3.pod-a" {
				t.Fatalf("%s still has stale field %q", k, f)
			}
		}
	}
}

// Several daemons add and remove the same keys for their own pods at the same
// time; no update is lost and no entry is corrupted.
func TestConcurrentWriters(t *testing.T) {
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			url, _ := startRedis(t, mode)
			ns := redistest.UniqueNS(t)
			ctx := context.Background()
			keys := seqKeys(40, 1<<40)
			const writers = 6
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				d, in := newTestIndex(t, url, func(c *Config) { c.Namespace = ns })
				wg.Add(1)
				go func() {
					defer wg.Done()
					m, p := in.Model("m"), in.Pod("pod"+strconv.Itoa(w), 0)
					for round := range 15 {
						if err := d.Add(ctx, m, p, event.TierGPU, keys); err != nil {
							errs <- err
							return
						}
						if err := d.Remove(ctx, m, p, event.TierGPU, keys[round%7:]); err != nil {
							errs <- err
							return
						}
						if round%5 == 4 {
							if err := d.ClearPod(ctx, p); err != nil {
								errs <- err
								return
							}
						}
					}
					errs <- d.Add(ctx, m, p, event.TierGPU, keys)
				}()
			}
			// A reader sharing its Index (and epoch cache) with writer 0's
			// clears runs alongside: the race detector checks the caches.
			stop := make(chan struct{})
			readerDone := make(chan error, 1)
			go func() {
				d, in := newTestIndex(t, url, func(c *Config) { c.Namespace = ns })
				m, p := in.Model("m"), in.Pod("pod-r", 0)
				clearerDone := make(chan struct{})
				defer func() { <-clearerDone }()
				go func() { // clears on the same Index, concurrently with its lookups
					defer close(clearerDone)
					for {
						select {
						case <-stop:
							return
						default:
						}
						if err := d.ClearPod(ctx, p); err != nil {
							return
						}
					}
				}()
				for {
					select {
					case <-stop:
						readerDone <- nil
						return
					default:
					}
					var cv countVisits
					if err := d.Lookup(ctx, m, keys, &cv); err != nil {
						readerDone <- err
						return
					}
				}
			}()
			wg.Wait()
			close(stop)
			if err := <-readerDone; err != nil {
				t.Fatal(err)
			}
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			d, in := newTestIndex(t, url, func(c *Config) { c.Namespace = ns })
			got := indextest.Lookup(t, d, in.Model("m"), keys, -1)
			if len(got) != len(keys) {
				t.Fatalf("lookup visited %d keys, want %d", len(got), len(keys))
			}
			for _, v := range got {
				if len(v.Holders) != writers {
					t.Fatalf("key %x has %d holders, want %d: %v", v.Key, len(v.Holders), writers, v.Holders)
				}
			}
			for w := range writers {
				if n, err := d.PodBlocks(ctx, in.Pod("pod"+strconv.Itoa(w), 0)); err != nil || n != int64(len(keys)) {
					t.Fatalf("PodBlocks(pod%d) = %d, %v; want %d", w, n, err, len(keys))
				}
			}
			if d.Malformed() != 0 {
				t.Fatalf("%d malformed entries", d.Malformed())
			}
		})
	}
}

// A lookup of 512 keys is one round trip on a single node, and one per
// master on a cluster (all three hold some of the keys).
func TestRoundTripsPerLookup(t *testing.T) {
	for _, mode := range []string{"single", "single-server-walk", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			url, nodes := startRedis(t, mode)
			idx, in, rt := newCountedIndex(t, url, func(c *Config) { c.ServerWalk = mode == "single-server-walk" })
			ctx := context.Background()
			m := in.Model("m")
			keys := seqKeys(512, 7<<32)
			for p := range 8 {
				if err := idx.Add(ctx, m, in.Pod("p"+strconv.Itoa(p), 0), event.TierGPU, keys[:64*(p+1)]); err != nil {
					t.Fatal(err)
				}
			}
			// Warm: epochs loaded, scripts cached.
			var cv countVisits
			if err := idx.Lookup(ctx, m, keys, &cv); err != nil || cv.n != 512 {
				t.Fatalf("lookup: %v, %d visits", err, cv.n)
			}
			for _, s := range nodes {
				if n, _ := s.Do("DBSIZE"); n == "0" {
					t.Fatalf("node %s holds no key: keys are not spread", s.Addr())
				}
			}
			rt.Reset()
			cv = countVisits{}
			if err := idx.Lookup(ctx, m, keys, &cv); err != nil || cv.n != 512 {
				t.Fatalf("lookup: %v, %d visits", err, cv.n)
			}
			if got, want := rt.Load(), int64(len(nodes)); got != want {
				t.Fatalf("lookup of 512 keys took %d round trips, want %d (one per node)", got, want)
			}
			// A write of 64 keys: one pipeline per node + the counter update.
			rt.Reset()
			if err := idx.Add(ctx, m, in.Pod("p-new", 0), event.TierGPU, keys[:64]); err != nil {
				t.Fatal(err)
			}
			if got, want := rt.Load(), int64(len(nodes)+1); got != want {
				t.Fatalf("add of 64 keys took %d round trips, want %d", got, want)
			}
			// Pod listings: every pod's block count in one round trip, equal
			// to PodBlocks one by one (0 for a pod never seen, and for a
			// cleared pod).
			if err := idx.ClearPod(ctx, in.Pod("p7", 0)); err != nil {
				t.Fatal(err)
			}
			pods := []kvindex.PodID{in.Pod("ghost", 0), in.Pod("p-new", 0), in.Pod("p7", 0)}
			for p := range 7 {
				pods = append(pods, in.Pod("p"+strconv.Itoa(p), 0))
			}
			got := make([]int64, len(pods))
			rt.Reset()
			if err := idx.PodBlocksBatch(ctx, pods, got); err != nil {
				t.Fatal(err)
			}
			if n := rt.Load(); n != 1 {
				t.Fatalf("PodBlocksBatch of %d pods took %d round trips, want 1", len(pods), n)
			}
			want := []int64{0, 64, 0}
			for p := range 7 {
				want = append(want, int64(64*(p+1)))
			}
			for i, p := range pods {
				one, err := idx.PodBlocks(ctx, p)
				if err != nil || got[i] != want[i] || one != want[i] {
					t.Fatalf("pod %d: batch %d, PodBlocks %d (%v), want %d", i, got[i], one, err, want[i])
				}
			}
			if err := idx.PodBlocksBatch(ctx, pods, got[:1]); err == nil {
				t.Fatal("PodBlocksBatch with a short out slice: no error")
			}
		})
	}
}

// TTL is set on block keys and refreshed by add; the namespace confines
// every key; foreign keys survive everything, including clears.
func TestTTLAndNamespace(t *testing.T) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "foreign:key", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ns := redistest.UniqueNS(t)
	idx, in := newTestIndex(t, s.URL(), func(c *Config) { c.Namespace = ns; c.TTL = time.Hour })
	m, p := in.Model("m"), in.Pod("p", 0)
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); err != nil {
		t.Fatal(err)
	}
	k := ns + ":b:m:0000000000000001"
	if err := c.PExpire(ctx, k, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(1, 1)); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := c.PTTL(ctx, k).Result(); ttl <= time.Minute || ttl > time.Hour {
		t.Fatalf("TTL after re-add = %v, want refreshed to ~1h", ttl)
	}
	if err := idx.ClearPod(ctx, p); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*").Result() // our own throw-away server: KEYS is fine here
	if err != nil {
		t.Fatal(err)
	}
	foreign := 0
	for _, key := range keys {
		if key == "foreign:key" {
			foreign++
			continue
		}
		if len(key) <= len(ns) || key[:len(ns)+1] != ns+":" {
			t.Fatalf("key %q outside namespace %q", key, ns)
		}
	}
	if foreign != 1 {
		t.Fatal("foreign key was touched")
	}
	// No TTL when disabled.
	idx2, in2 := newTestIndex(t, s.URL(), func(c *Config) { c.TTL = -1 })
	if err := idx2.Add(ctx, in2.Model("m"), in2.Pod("p", 0), event.TierGPU, seqKeys(1, 1)); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := c.PTTL(ctx, idx2.Namespace()+":b:m:0000000000000001").Result(); ttl != -1 {
		t.Fatalf("TTL with TTL disabled = %v", ttl)
	}
}

// Redis down at start: New succeeds, Healthy and operations fail with
// ErrUnavailable, and it recovers by itself when Redis comes up.
func TestRedisDownAtStart(t *testing.T) {
	s := redistest.Start(t)
	s.Kill()
	idx, in := newTestIndex(t, s.URL(), func(c *Config) { c.DialTimeout = 200 * time.Millisecond })
	ctx := context.Background()
	if err := idx.Healthy(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Healthy with redis down = %v", err)
	}
	m, p := in.Model("m"), in.Pod("p", 0)
	var cv countVisits
	if err := idx.Lookup(ctx, m, seqKeys(3, 1), &cv); !errors.Is(err, ErrUnavailable) || cv.n != 0 {
		t.Fatalf("Lookup with redis down = %v (%d visits)", err, cv.n)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Add with redis down = %v", err)
	}
	if err := idx.ClearPod(ctx, p); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ClearPod with redis down = %v", err)
	}
	if _, err := idx.PodBlocks(ctx, p); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("PodBlocks with redis down = %v", err)
	}
	s.Restart()
	wait.For(t, "healthy after redis starts", func() bool { return idx.Healthy(ctx) == nil })
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, idx, m, seqKeys(3, 1), -1); len(got) != 3 {
		t.Fatalf("after recovery lookup = %v", got)
	}
}

// Redis lost while running: errors (never a silent empty answer), then
// recovery without restart; scripts are reloaded after the restart.
func TestRedisLostWhileRunning(t *testing.T) {
	s := redistest.Start(t)
	idx, in := newTestIndex(t, s.URL(), func(c *Config) {
		c.DialTimeout = 200 * time.Millisecond
		c.ReadTimeout = 200 * time.Millisecond
	})
	ctx := context.Background()
	m, p := in.Model("m"), in.Pod("p", 0)
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := idx.ClearPod(ctx, p); err != nil { // epoch > 0 before the loss
		t.Fatal(err)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	var cv countVisits
	if err := idx.Lookup(ctx, m, seqKeys(3, 1), &cv); !errors.Is(err, ErrUnavailable) || cv.n != 0 {
		t.Fatalf("Lookup with redis lost = %v (%d visits)", err, cv.n)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(1, 9)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Add with redis lost = %v", err)
	}
	if err := idx.Healthy(ctx); err == nil {
		t.Fatal("healthy with redis lost")
	}
	s.Restart() // empty: data, epochs and scripts are gone
	wait.For(t, "healthy again", func() bool { return idx.Healthy(ctx) == nil })
	if n, err := s.Do("DBSIZE"); err != nil || n != "0" {
		t.Fatalf("after restart DBSIZE = %q, %v; want an empty server", n, err)
	}
	// Writes made with the pre-loss epoch cache (nothing has reloaded it
	// yet: no lookup ran since the restart), so entries carry the old,
	// time-based epoch while Redis now says the pod's epoch is 0. A clear
	// (what the Applier does for untrusted pods) must still hide them: a
	// counter-only epoch (old+1 = 1) would not.
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(3, 1)); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, idx, m, seqKeys(3, 1), -1); len(got) != 3 {
		t.Fatalf("after restart and re-add lookup = %v, want 3 keys", got)
	}
	if err := idx.ClearPod(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, idx, m, seqKeys(3, 1), -1); len(got) != 0 {
		t.Fatalf("after clear lookup = %v, want nothing", got)
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, seqKeys(2, 1)); err != nil {
		t.Fatal(err)
	}
	if got := indextest.Lookup(t, idx, m, seqKeys(3, 1), -1); len(got) != 2 {
		t.Fatalf("rebuilt lookup = %v, want 2 keys", got)
	}
}

// A cluster with one master down: lookups fail (never a shortened answer).
func TestClusterNodeDown(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	idx, in := newTestIndex(t, c.URL(), func(c *Config) {
		c.DialTimeout = 200 * time.Millisecond
		c.ReadTimeout = 200 * time.Millisecond
	})
	ctx := context.Background()
	m := in.Model("m")
	keys := seqKeys(64, 5<<20)
	if err := idx.Add(ctx, m, in.Pod("p", 0), event.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	c.Nodes[1].Kill()
	var cv countVisits
	if err := idx.Lookup(ctx, m, keys, &cv); !errors.Is(err, ErrUnavailable) || cv.n != 0 {
		t.Fatalf("lookup with a master down = %v (%d visits)", err, cv.n)
	}
	if err := idx.Healthy(ctx); err == nil {
		t.Fatal("healthy with a master down")
	}
}

// ClearPodsNamed clears every rank of a pod known to the shared index, even
// ranks this process never interned (a daemon taking over an endpoint).
func TestClearPodsNamed(t *testing.T) {
	s := redistest.Start(t)
	ns := redistest.UniqueNS(t)
	ctx := context.Background()
	d1, in1 := newTestIndex(t, s.URL(), func(c *Config) { c.Namespace = ns })
	m := in1.Model("m")
	for _, p := range []kvindex.PodID{in1.Pod("pod", 0), in1.Pod("pod", 1), in1.Pod("pod.x", 0), in1.Pod("other", 0)} {
		if err := d1.Add(ctx, m, p, event.TierGPU, seqKeys(2, 1)); err != nil {
			t.Fatal(err)
		}
	}
	d2, in2 := newTestIndex(t, s.URL(), func(c *Config) { c.Namespace = ns })
	if err := d2.ClearPodsNamed(ctx, "pod"); err != nil {
		t.Fatal(err)
	}
	got := dump(t, d2, in2, seqKeys(2, 1))
	if want := "0:[other/gpu pod.x/gpu] 1:[other/gpu pod.x/gpu] "; got != want {
		t.Fatalf("after ClearPodsNamed(pod): %q, want %q", got, want)
	}
}

// No error from parsing an index URL shows its password, whatever part of
// the URL is wrong: net/url quotes the whole URL in its errors, so they
// must be reduced before they are wrapped (ParseIndexFlag, New, NewClient).
func TestIndexURLErrorsHidePassword(t *testing.T) {
	for _, pw := range []string{"s3cr3tpw", "s3cr%41tpw"} {
		for _, v := range []string{
			"redis://user:" + pw + "@host:badport/0",
			"redis://:" + pw + "@host:6379/notadb",
			"redis://user:" + pw + "@[::1/0",
			"redis://user:" + pw + "%zz@host:1/0",
			"rediss://user:" + pw + "@host:1?ttl=soon",
			"redis://user:" + pw + "@host:1?bogus=1",
			"redis-cluster://user:" + pw + "@h1:1,h2:badport",
			"redis-cluster://user:" + pw + "%zz@h1:1",
			"redis-cluster://user:" + pw + "@h1:1?pool_size=many",
		} {
			_, perr := ParseIndexFlag(v)
			_, nerr := New(context.Background(), Config{URL: v, Interner: kvindex.NewInterner()})
			_, cerr := NewClient(Config{URL: v})
			for what, err := range map[string]error{"ParseIndexFlag": perr, "New": nerr, "NewClient": cerr} {
				if err == nil {
					t.Errorf("%s(%q): no error", what, v)
					continue
				}
				// "%zz": a bad escape in the password is not quoted either.
				for _, secret := range []string{"s3cr3tpw", "s3crAtpw", "s3cr%41tpw", "%zz"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("%s(%q) leaks the password: %v", what, v, err)
					}
				}
			}
		}
	}
}

// recordFields decodes the holder fields of a block value (none for a
// missing key).
func recordFields(v string, err error) ([]string, error) {
	if err == redis.Nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for pos := 0; pos < len(v); {
		f, _, next, ok := nextRecord(v, pos)
		if !ok {
			return nil, fmt.Errorf("malformed block value %q", v)
		}
		out = append(out, f)
		pos = next
	}
	return out, nil
}
