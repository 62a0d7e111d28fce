package redisindex

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

// A node that hangs with its connection open (DEBUG SLEEP) fails every call
// with ErrUnavailable once CallTimeout has passed, retries included: none
// waits for the sleep to end and answers as if nothing happened. With
// CallTimeout = ReadTimeout (as the defaults, 1 s each) and a sleep of 1.6x
// that, a call bounded only per attempt times out once, retries, and gets
// its answer when the sleep ends.
func TestCallTimeoutHoldsOnAHungNode(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "local")
	idx, in := newTestIndex(t, srv.URL(), func(c *Config) {
		c.CallTimeout, c.ReadTimeout, c.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	})
	ctx := context.Background()
	m, p := in.Model("m"), in.Pod("p", 0)
	keys := []kvindex.Key{1, 2}
	if err := idx.Add(ctx, m, p, kvindex.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	defer c.Close()
	calls := []struct {
		name string
		call func() error
	}{
		{"Lookup", func() error {
			return idx.Lookup(ctx, m, keys, visitAll{})
		}},
		{"Add", func() error { return idx.Add(ctx, m, p, kvindex.TierGPU, []kvindex.Key{3}) }},
		{"Remove", func() error { return idx.Remove(ctx, m, p, kvindex.TierGPU, []kvindex.Key{1}) }},
		{"ClearPod", func() error { return idx.ClearPod(ctx, p) }},
		{"PodBlocks", func() error { _, err := idx.PodBlocks(ctx, p); return err }},
		{"PodBlocksBatch", func() error { return idx.PodBlocksBatch(ctx, []kvindex.PodID{p}, make([]int64, 1)) }},
		{"Healthy", func() error { return idx.Healthy(ctx) }},
		{"HasModelKey", func() error { _, err := idx.HasModelKey(ctx, "m", 1); return err }},
	}
	for _, tc := range calls {
		slept := make(chan error, 1)
		go func() { slept <- c.Do(ctx, "DEBUG", "SLEEP", "0.8").Err() }()
		waitSleeping(t, srv)
		err := tc.call()
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s on a node asleep for 0.8 s with CallTimeout 500ms: err %v, want ErrUnavailable", tc.name, err)
		}
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
	}
}

// waitSleeping returns once the server is inside DEBUG SLEEP (a PING from
// another connection goes unanswered).
func waitSleeping(t *testing.T, srv *redistest.Server) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	for i := 0; i < 200; i++ {
		if err := c.Ping(context.Background()).Err(); err != nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("DEBUG SLEEP did not start")
}

type visitAll struct{}

func (visitAll) Visit(int, kvindex.Key, []kvindex.Holder) bool { return true }
