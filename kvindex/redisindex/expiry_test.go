package redisindex

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

// waitPatterns waits until every node has want pattern subscriptions (the
// index's expiry watcher subscribed, or not).
func waitPatterns(t *testing.T, want string, nodes ...*redistest.Server) {
	t.Helper()
	for _, s := range nodes {
		wait.For(t, "PUBSUB NUMPAT = "+want+" on "+s.Addr(), func() bool {
			n, err := s.Do("PUBSUB", "NUMPAT")
			return err == nil && n == want
		})
	}
}

// watcherGoroutines counts live goroutines running expiry-watcher code.
func watcherGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		var own []string
		for _, l := range strings.Split(g, "\n") {
			if !strings.HasPrefix(l, "created by ") {
				own = append(own, l)
			}
		}
		s := strings.Join(own, "\n")
		if strings.Contains(s, "redisindex.(*Index).watch") || strings.Contains(s, "redisindex.(*Index).countExpired") {
			count++
		}
	}
	return count
}

func requireNoWatchers(t *testing.T) {
	t.Helper()
	// Close waits for every watcher, but the goroutine that context.AfterFunc
	// ran to close a subscription may still be returning (its close(closed)
	// has happened, its frame not yet gone): allow it a moment to exit. A
	// leaked watcher stays, and fails here.
	wait.Until(t, "the expiry watchers ended after Close", func() string {
		if n := watcherGoroutines(); n != 0 {
			return fmt.Sprintf("%d expiry-watcher goroutines still running", n)
		}
		return ""
	})
}

// waitExpired waits until the index counted want TTL expirations and the
// server holds only the keys in keep.
func waitExpired(t *testing.T, idx *Index, want int64, keep string, nodes ...*redistest.Server) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d TTL expirations counted", want), func() bool {
		if idx.TTLExpirations() < want {
			return false
		}
		total := 0
		for _, s := range nodes {
			n, err := s.Do("DBSIZE")
			if err != nil {
				return false
			}
			var k int
			fmt.Sscan(n, &k)
			total += k
		}
		return fmt.Sprint(total) == keep
	})
}

// Notifications on: every expired block key of both models is counted once,
// expiring keys outside our block keys are not, counting survives idle
// periods (ping) and a Redis restart, and Close leaves no goroutine.
// Notifications off: nothing subscribed, a single warning. CONFIG refused
// (managed Redis): subscribe anyway and count.
func TestTTLExpirationsCounted(t *testing.T) {
	defer func(p time.Duration) { expiryIdlePing = p }(expiryIdlePing)
	expiryIdlePing = 200 * time.Millisecond // exercise the idle PING path
	ctx := context.Background()
	t.Run("group", func(t *testing.T) {
		t.Run("notifications-on", func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t, "--notify-keyspace-events", "Ex")
			var logs logtest.Buffer
			ns := redistest.UniqueNS(t)
			idx, in := newTestIndex(t, s.URL(), func(c *Config) {
				c.Namespace, c.TTL, c.Logger = ns, time.Second, logs.Logger()
			})
			c := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, DisableIdentity: true})
			defer c.Close()
			waitPatterns(t, "1", s)
			m1, m2 := in.Model("m1"), in.Model("m{2}")
			p, q := in.Pod("p", 0), in.Pod("q", 1)
			for _, a := range []struct {
				m    kvindex.ModelID
				p    kvindex.PodID
				keys []blockkeys.Key
			}{
				{m1, p, seqKeys(3, 1)},
				{m1, q, seqKeys(2, 1)}, // same block keys, second holder
				{m2, p, seqKeys(2, 1<<40)},
			} {
				if err := idx.Add(ctx, a.m, a.p, event.TierGPU, a.keys); err != nil {
					t.Fatal(err)
				}
			}
			const blockKeys = 5
			// Expiring keys that are not our block keys.
			for _, k := range []string{"foreign:key", "other:b:m1:0000000000000001",
				ns + "x:b:m1:0000000000000001", ns + ":b:m1:not-a-block-key", ns + ":lease:ep"} {
				if err := c.Set(ctx, k, "v", 300*time.Millisecond).Err(); err != nil {
					t.Fatal(err)
				}
			}
			waitExpired(t, idx, blockKeys, "1", s) // only <ns>:pods is left
			// Events reach the watcher in the order the server emits
			// them: once a last block key expiring after everything
			// else is counted, every earlier event has been seen.
			if err := c.Set(ctx, ns+":b:m1:ffffffffffffffff", "v", time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			waitExpired(t, idx, blockKeys+1, "1", s)
			if got := idx.TTLExpirations(); got != blockKeys+1 {
				t.Fatalf("TTLExpirations = %d, want %d (foreign keys counted?)", got, blockKeys+1)
			}
			if got := idx.Stats().Expired; got != blockKeys+1 {
				t.Fatalf("Stats().Expired = %d, want %d", got, blockKeys+1)
			}
			// Redis restarts (empty, same settings): the watcher
			// re-checks the setting, subscribes again and goes on
			// counting.
			s.Restart()
			waitPatterns(t, "1", s)
			if err := idx.Add(ctx, m1, p, event.TierGPU, seqKeys(2, 100)); err != nil {
				t.Fatal(err)
			}
			waitExpired(t, idx, blockKeys+3, "1", s)
			if l := logs.String(); strings.Contains(l, "level=WARN") {
				t.Fatalf("unexpected warning: %s", l)
			}
			idx.Close()
			waitPatterns(t, "0", s)
		})
		t.Run("notifications-off", func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t) // notify-keyspace-events "" (the default)
			var logs logtest.Buffer
			idx, in := newTestIndex(t, s.URL(), func(c *Config) {
				c.TTL, c.Logger = 200*time.Millisecond, logs.Logger()
			})
			wait.For(t, "warning logged", func() bool { return strings.Contains(logs.String(), "level=WARN") })
			if err := idx.Add(ctx, in.Model("m"), in.Pod("p", 0), event.TierGPU, seqKeys(3, 1)); err != nil {
				t.Fatal(err)
			}
			waitExpired(t, idx, 0, "1", s)
			if n, err := s.Do("PUBSUB", "NUMPAT"); err != nil || n != "0" {
				t.Fatalf("PUBSUB NUMPAT = %q, %v: subscribed although notifications are off", n, err)
			}
			if got := idx.TTLExpirations(); got != 0 {
				t.Fatalf("TTLExpirations = %d without notifications", got)
			}
			l := logs.String()
			if n := strings.Count(l, "level=WARN"); n != 1 || !strings.Contains(l, "notify-keyspace-events Ex") ||
				!strings.Contains(l, "cannot be counted") {
				t.Fatalf("want exactly one warning naming notify-keyspace-events Ex, got %d:\n%s", n, l)
			}
		})
		t.Run("config-refused", func(t *testing.T) {
			t.Parallel()
			// Managed Redis: CONFIG is not available, notifications are
			// on (set by the provider).
			s := redistest.Start(t, "--notify-keyspace-events", "Ex", "--rename-command", "CONFIG", "")
			var logs logtest.Buffer
			idx, in := newTestIndex(t, s.URL(), func(c *Config) {
				c.TTL, c.Logger = 200*time.Millisecond, logs.Logger()
			})
			waitPatterns(t, "1", s)
			if err := idx.Add(ctx, in.Model("m"), in.Pod("p", 0), event.TierGPU, seqKeys(3, 1)); err != nil {
				t.Fatal(err)
			}
			waitExpired(t, idx, 3, "1", s)
			if l := logs.String(); !strings.Contains(l, "cannot read notify-keyspace-events") || strings.Contains(l, "level=WARN") {
				t.Fatalf("want one info line about the unreadable setting, got:\n%s", l)
			}
		})
	})
	requireNoWatchers(t)
}

// Cluster: keyspace events are local to each master, so the index
// subscribes on every master and counts each expiration exactly once.
func TestTTLExpirationsCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, "--notify-keyspace-events", "Ex")
	ns := redistest.UniqueNS(t)
	idx, in := newTestIndex(t, cl.URL(), func(c *Config) { c.Namespace, c.TTL = ns, time.Second })
	waitPatterns(t, "1", cl.Nodes...)
	ctx := context.Background()
	const perModel = 20
	for _, m := range []string{"m1", "m2"} {
		if err := idx.Add(ctx, in.Model(m), in.Pod("p", 0), event.TierGPU, seqKeys(perModel, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range cl.Nodes {
		if k, err := s.Do("KEYS", ns+":b:*"); err != nil || k == "" { // our throw-away servers
			t.Fatalf("node %s holds no block key (%v): the test would not cover it", s.Addr(), err)
		}
	}
	waitExpired(t, idx, 2*perModel, "1", cl.Nodes...) // only <ns>:pods is left
	// One last block key per master, expiring after everything else: once
	// all are counted, every earlier event of every master has been seen.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cl.Nodes[0].Addr()}, Protocol: 2, DisableIdentity: true})
	defer cc.Close()
	covered := map[string]bool{}
	for i := 0; len(covered) < len(cl.Nodes); i++ {
		if i > 1000 {
			t.Fatal("no sentinel key found for every master")
		}
		k := fmt.Sprintf("%s:b:sentinel:%016x", ns, i)
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		keep := false
		for _, s := range cl.Nodes {
			if n, _ := s.Do("EXISTS", k); n == "1" && !covered[s.Addr()] {
				covered[s.Addr()], keep = true, true
			}
		}
		if keep {
			err := cc.PExpire(ctx, k, time.Millisecond).Err()
			if err != nil {
				t.Fatal(err)
			}
		} else if err := cc.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := int64(2*perModel + len(cl.Nodes))
	waitExpired(t, idx, want, "1", cl.Nodes...)
	if got := idx.TTLExpirations(); got != want {
		t.Fatalf("TTLExpirations = %d, want %d (each expiration once)", got, want)
	}
	idx.Close()
	requireNoWatchers(t)
	waitPatterns(t, "0", cl.Nodes...)
}
