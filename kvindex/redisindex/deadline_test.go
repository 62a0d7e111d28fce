package redisindex

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
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
	keys := []blockkeys.Key{1, 2}
	if err := idx.Add(ctx, m, p, event.TierGPU, keys); err != nil {
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
		{"Add", func() error { return idx.Add(ctx, m, p, event.TierGPU, []blockkeys.Key{3}) }},
		{"Remove", func() error { return idx.Remove(ctx, m, p, event.TierGPU, []blockkeys.Key{1}) }},
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

func (visitAll) Visit(int, blockkeys.Key, []kvindex.Holder) bool { return true }

// On Cluster a hung master fails, at the deadline, the lookups that read
// one of its keys; a lookup whose keys (and the pods hash) live on the
// other masters is answered.
func TestCallTimeoutClusterHungMaster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, "--enable-debug-command", "local")
	idx, in := newTestIndex(t, cl.URL(), func(c *Config) {
		c.CallTimeout, c.ReadTimeout, c.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	})
	ctx := context.Background()
	cc := idx.c.(*redis.ClusterClient)
	m, p := in.Model("m"), in.Pod("p", 0)
	podsNode, err := cc.MasterForKey(ctx, idx.podsKey)
	if err != nil {
		t.Fatal(err)
	}
	// The hung master: one that does not hold the pods hash. Keys on it
	// and keys elsewhere.
	var hung *redistest.Server
	for _, s := range cl.Nodes {
		if s.Addr() != podsNode.Options().Addr {
			hung = s
			break
		}
	}
	var on, off []blockkeys.Key
	for k := blockkeys.Key(1); len(on) < 2 || len(off) < 2; k++ {
		node, err := cc.MasterForKey(ctx, blockKeys(nil, idx.modelPrefix(m), []blockkeys.Key{k})[0])
		if err != nil {
			t.Fatal(err)
		}
		if node.Options().Addr == hung.Addr() {
			on = append(on, k)
		} else {
			off = append(off, k)
		}
	}
	if err := idx.Add(ctx, m, p, event.TierGPU, append(append([]blockkeys.Key{}, on...), off...)); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: hung.Addr(), Protocol: 2, DisableIdentity: true})
	defer c.Close()
	slept := make(chan error, 1)
	go func() { slept <- c.Do(ctx, "DEBUG", "SLEEP", "1.5").Err() }()
	waitSleeping(t, hung)
	if err := idx.Lookup(ctx, m, off, visitAll{}); err != nil {
		t.Errorf("lookup of keys on the other masters: %v", err)
	}
	if err := idx.Lookup(ctx, m, on, visitAll{}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("lookup of keys on the hung master: %v, want ErrUnavailable", err)
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
}
