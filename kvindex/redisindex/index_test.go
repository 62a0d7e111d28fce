package redisindex

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

func newTestIndex(t testing.TB, url string, mod func(*Config)) (*Index, *kvindex.Interner) {
	t.Helper()
	return newTestIndexWith(t, url, kvindex.NewInterner(), mod)
}

func newTestIndexWith(t testing.TB, url string, in *kvindex.Interner, mod func(*Config)) (*Index, *kvindex.Interner) {
	t.Helper()
	idx, err := New(context.Background(), testConfig(t, url, in, mod))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { idx.Close() })
	return idx, in
}

// testConfig is the tests' index config: a namespace of the test's own, and
// stats refreshed and loss checked (loss_test.go) only when a test asks; mod (if not nil) changes the rest.
func testConfig(t testing.TB, url string, in *kvindex.Interner, mod func(*Config)) Config {
	cfg := Config{URL: url, Namespace: redistest.UniqueNS(t), Interner: in, StatsRefresh: time.Hour, LossCheck: -1}
	if mod != nil {
		mod(&cfg)
	}
	return cfg
}

// newCountedIndex is newTestIndex on a client of its own with a round-trip
// counter installed, then hooks (in order): for tests and benchmarks that
// count or hold what is sent to Redis.
func newCountedIndex(t testing.TB, url string, mod func(*Config), hooks ...redis.Hook) (*Index, *kvindex.Interner, *redistest.RoundTrips) {
	t.Helper()
	in := kvindex.NewInterner()
	cfg := testConfig(t, url, in, mod)
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt := &redistest.RoundTrips{}
	rt.Attach(c)
	for _, h := range hooks {
		redistest.AddHook(c, h)
	}
	idx, err := NewWithClient(c, cfg)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close(); c.Close() })
	return idx, in, rt
}

// startRedis starts what mode names for a test: a three-master cluster for
// "cluster", a single server otherwise. It returns the URL and the nodes.
func startRedis(t testing.TB, mode string) (string, []*redistest.Server) {
	t.Helper()
	if mode == "cluster" {
		c := redistest.StartCluster(t, 3)
		return c.URL(), c.Nodes
	}
	s := redistest.Start(t)
	return s.URL(), []*redistest.Server{s}
}

// statsFresh wraps an Index so Stats() reflects Redis now (the real one
// refreshes in the background), which the conformance suite checks.
type statsFresh struct{ *Index }

func (s statsFresh) Stats() kvindex.IndexStats {
	_ = s.loadEpochs(context.Background())
	return s.Index.Stats()
}

func redisIndex(url string, walk bool) indextest.NewIndex {
	return func(t *testing.T, in *kvindex.Interner) kvindex.Index {
		idx, _ := newTestIndexWith(t, url, in, func(c *Config) { c.ServerWalk = walk })
		return statsFresh{idx}
	}
}

func TestConformanceRedis(t *testing.T) {
	s := redistest.Start(t)
	t.Run("pipeline", func(t *testing.T) { indextest.Run(t, redisIndex(s.URL(), false)) })
	t.Run("server-walk", func(t *testing.T) { indextest.Run(t, redisIndex(s.URL(), true)) })
}

func TestConformanceRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	indextest.Run(t, redisIndex(c.URL(), false))
}

// The shared tier is credited at score time (indexer), never stored: the
// index refuses it as it refuses any tier past the stored ones, as the
// in-memory index does.
func TestWriteRefusesTheSharedTier(t *testing.T) {
	srv := redistest.Start(t)
	idx, in := newTestIndex(t, srv.URL(), nil)
	ctx := context.Background()
	model, pod := in.Model("m"), in.Pod("p", 0)
	for _, tier := range []event.Tier{event.TierShared, event.NumTiers} {
		if err := idx.Add(ctx, model, pod, tier, []blockkeys.Key{1}); err == nil {
			t.Errorf("Add on tier %v accepted", tier)
		}
	}
	if err := idx.Add(ctx, model, pod, event.TierExternal, []blockkeys.Key{1}); err != nil {
		t.Errorf("Add on the last stored tier: %v", err)
	}
}
