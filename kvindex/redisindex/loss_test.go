package redisindex

import (
	"context"
	"strconv"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// Each way Redis loses the index behind the daemon is reported once, by
// its reason, and nothing is reported while nothing was lost.
func TestLossDetection(t *testing.T) {
	srv := redistest.Start(t)
	idx, in := newTestIndex(t, srv.URL(), func(c *Config) { c.LossCheck = -1 })
	var got []string
	idx.OnLost(func(r string) { got = append(got, r) })
	ctx := context.Background()
	check := func(want string) {
		t.Helper()
		got = got[:0]
		idx.checkLoss(ctx)
		if (want == "" && len(got) != 0) || (want != "" && (len(got) != 1 || got[0] != want)) {
			t.Fatalf("reported %q, want %q", got, want)
		}
	}
	check("") // baseline
	m, p := in.Model("m"), in.Pod("p", 0)
	if err := idx.Add(ctx, m, p, event.TierGPU, []blockkeys.Key{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	check("")

	srv.Restart()
	check("restart")
	check("")

	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	check("flush")
	check("")

	// maxmemory + volatile-lru, as recommended: block keys (all with a
	// TTL) are evicted once the server is over its limit.
	used, err := srv.InfoField("memory", "used_memory")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(used, 10, 64)
	for _, kv := range [][2]string{{"maxmemory-policy", "volatile-lru"}, {"maxmemory", strconv.FormatInt(n+256<<10, 10)}} {
		if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]blockkeys.Key, 512)
	for i := 0; i < 64; i++ {
		for j := range keys {
			keys[j] = blockkeys.Key(i*len(keys) + j + 1)
		}
		_ = idx.Add(ctx, m, p, event.TierGPU, keys) // may fail with OOM once full
	}
	if ev, _ := srv.InfoField("stats", "evicted_keys"); ev == "0" {
		t.Fatal("the test did not make Redis evict")
	}
	check("eviction")
	if idx.Losses() != 3 {
		t.Fatalf("Losses %d, want 3", idx.Losses())
	}
}
