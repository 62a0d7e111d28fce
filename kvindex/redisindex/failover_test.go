package redisindex

import (
	"context"
	"errors"
	"strconv"
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

// hungCluster is a 3-master cluster with one replica per master
// (cluster-node-timeout 1 s) and an index on it, for the tests where one
// master stops answering (SIGSTOP) and the cluster fails it over.
type hungCluster struct {
	cl      *redistest.Cluster
	idx     *Index
	in      *kvindex.Interner
	cc      *redis.ClusterClient
	pods    string // address of the master holding the pods hash
	m       kvindex.ModelID
	hung    *redistest.Server
	replica *redistest.Server // the hung master's replica
}

// The index's call deadline is 500 ms while a read may wait 5 s: a call
// bounded only per attempt would take 5 s or more on a hung node. No TTL
// and no loss check: the expiry watcher and the loss check reload the
// Cluster slot map on their own schedule (ForEachMaster), and these tests
// check that the index follows a failover without them.
func startHungCluster(t *testing.T) *hungCluster {
	t.Helper()
	h := &hungCluster{cl: redistest.StartClusterWith(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})}
	h.idx, h.in = newTestIndex(t, h.cl.URL(), func(c *Config) {
		c.CallTimeout, c.ReadTimeout, c.WriteTimeout, c.TTL = 500*time.Millisecond, 5*time.Second, 5*time.Second, -1
	})
	h.cc = h.idx.c.(*redis.ClusterClient)
	h.m = h.in.Model("m")
	node, err := h.cc.MasterForKey(context.Background(), h.idx.podsKey)
	if err != nil {
		t.Fatal(err)
	}
	h.pods = node.Options().Addr
	return h
}

// pause stops master s (SIGSTOP) and finds its replica.
func (h *hungCluster) pause(t *testing.T, s *redistest.Server) {
	t.Helper()
	for _, r := range h.cl.Nodes {
		if p, _ := r.InfoField("replication", "master_port"); p == strconv.Itoa(s.Port()) {
			h.replica = r
		}
	}
	if h.replica == nil {
		t.Fatalf("no replica of %s", s.Addr())
	}
	h.hung = s
	s.Pause()
}

// master returns a master other than the pods hash's (pods=false) or the
// pods hash's own (pods=true).
func (h *hungCluster) master(t *testing.T, pods bool) *redistest.Server {
	t.Helper()
	for _, s := range h.cl.Nodes {
		if s.Role() == "master" && (s.Addr() == h.pods) == pods {
			return s
		}
	}
	t.Fatal("no such master")
	return nil
}

// keys returns n block keys whose slots live on s (on=true) or elsewhere.
func (h *hungCluster) keys(t *testing.T, s *redistest.Server, on bool, n int, from blockkeys.Key) []blockkeys.Key {
	t.Helper()
	var out []blockkeys.Key
	for k := from; len(out) < n; k++ {
		node, err := h.cc.MasterForKey(context.Background(), blockKeys(nil, h.idx.modelPrefix(h.m), []blockkeys.Key{k})[0])
		if err != nil {
			t.Fatal(err)
		}
		if (node.Options().Addr == s.Addr()) == on {
			out = append(out, k)
		}
	}
	return out
}

// waitFailover returns once the hung master's replica is a master.
func (h *hungCluster) waitFailover(t *testing.T) {
	t.Helper()
	wait.For(t, "the replica of the stopped master promoted", func() bool { return h.replica.Role() == "master" })
}

// bounded runs call, which must fail with ErrUnavailable while the node is
// still stopped: within 10 s, where a call bounded only by the 5 s read
// timeout and its retry takes 10 s or more.
func bounded(t *testing.T, what string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s on a stopped node: %v, want ErrUnavailable", what, err)
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s on a stopped node did not return within 10 s (call deadline 500 ms)", what)
		return nil
	}
}

// A master that stops answering (SIGSTOP) and is failed over while still
// stopped: the calls that need it fail at the call deadline, then at once
// (NodeHungError); writes and lookups of keys on the other masters go on
// as if nothing happened, also when they share a flush with a failing
// write; and once the cluster promoted the replica the index writes to it
// and reads from it, without the stopped master ever resuming.
func TestClusterHungMasterFailover(t *testing.T) {
	h := startHungCluster(t)
	ctx := context.Background()
	stopped := h.master(t, false)
	on := h.keys(t, stopped, true, 4, 1)
	off := h.keys(t, stopped, false, 64, 1)
	podOn, podOff := h.in.Pod("on", 0), h.in.Pod("off", 0)
	if err := h.idx.Add(ctx, h.m, podOn, event.TierGPU, on[:2]); err != nil {
		t.Fatal(err)
	}
	if err := h.idx.Add(ctx, h.m, podOff, event.TierGPU, off[:2]); err != nil {
		t.Fatal(err)
	}
	h.pause(t, stopped)

	// (a) bounded: the first call waits for the deadline, the next ones
	// fail at once, naming the node.
	bounded(t, "a lookup of its keys", func() error { return h.idx.Lookup(ctx, h.m, on[:2], visitAll{}) })
	var hungErr *NodeHungError
	if err := bounded(t, "the next lookup", func() error { return h.idx.Lookup(ctx, h.m, on[:2], visitAll{}) }); !errors.As(err, &hungErr) || hungErr.Addr != stopped.Addr() {
		t.Errorf("a lookup after one timed out: %v, want a NodeHungError naming %s", err, stopped.Addr())
	}
	// (b) a write of keys on it fails.
	if err := bounded(t, "a write of its keys", func() error { return h.idx.Add(ctx, h.m, podOn, event.TierGPU, on[2:]) }); !errors.As(err, &hungErr) {
		t.Errorf("a write to the stopped master: %v, want a NodeHungError", err)
	}
	// (c) keys on the other masters: written and read while it is
	// stopped, each write alongside one to the stopped master.
	for i := 2; i < len(off); i += 2 {
		errOn := make(chan error, 1)
		go func() { errOn <- h.idx.Add(ctx, h.m, podOn, event.TierGPU, on[2:]) }()
		if err := h.idx.Add(ctx, h.m, podOff, event.TierGPU, off[i:i+2]); err != nil {
			t.Fatalf("write %d of keys on the other masters while one is stopped: %v", i/2, err)
		}
		if err := <-errOn; !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a write to the stopped master: %v", err)
		}
	}
	if got := indextest.Lookup(t, h.idx, h.m, off, -1); len(got) != len(off) {
		t.Fatalf("lookup of keys on the other masters while one is stopped: %d of %d blocks", len(got), len(off))
	}
	if h.replica.Role() == "master" {
		t.Fatal("the replica was promoted before the checks of the stopped master: (a)-(c) proved nothing")
	}

	// (d) failed over: writes and reads reach the new master.
	h.waitFailover(t)
	wait.For(t, "a write of the stopped master's keys after the failover", func() bool {
		return h.idx.Add(ctx, h.m, podOn, event.TierGPU, on[2:]) == nil
	})
	// (on[:2] were written before the stop: replication is asynchronous,
	// the replica may not have them.)
	got := indextest.Lookup(t, h.idx, h.m, on[2:], -1)
	if len(got) != len(on)-2 || got[0].Holders[0].Pod != podOn {
		t.Fatalf("after the failover, lookup of the failed-over keys: %v", got)
	}
	// Healthy reloads the slot map (ForEachMaster), asking a random known
	// node: the stopped one, still known, fails at once instead of taking
	// the whole deadline (one check in six would fail).
	for i := 0; i < 30; i++ {
		if err := h.idx.Healthy(ctx); err != nil {
			t.Fatalf("Healthy after the failover (check %d): %v", i, err)
		}
	}
	t.Logf("%d slot map reloads asked by the guards", h.idx.reloads.Load())
}

// The master holding the pods hash (every write flush, lookup and clear
// reads it) stops: everything fails, at the deadline and then at once,
// and Healthy says so; once failed over, everything works again without
// it resuming.
func TestClusterHungPodsHashMaster(t *testing.T) {
	h := startHungCluster(t)
	ctx := context.Background()
	stopped := h.master(t, true)
	off := h.keys(t, stopped, false, 2, 1)
	pod := h.in.Pod("p", 0)
	if err := h.idx.Add(ctx, h.m, pod, event.TierGPU, off); err != nil {
		t.Fatal(err)
	}
	h.pause(t, stopped)
	bounded(t, "a write", func() error { return h.idx.Add(ctx, h.m, pod, event.TierGPU, off) })
	var hungErr *NodeHungError
	for name, call := range map[string]func() error{
		"write":   func() error { return h.idx.Add(ctx, h.m, pod, event.TierGPU, off) },
		"lookup":  func() error { return h.idx.Lookup(ctx, h.m, off, visitAll{}) },
		"clear":   func() error { return h.idx.ClearPod(ctx, pod) },
		"healthy": func() error { return h.idx.Healthy(ctx) },
	} {
		if err := bounded(t, name, call); !errors.As(err, &hungErr) {
			t.Errorf("%s with the pods hash's master stopped: %v, want a NodeHungError", name, err)
		}
	}
	if h.replica.Role() == "master" {
		t.Fatal("the replica was promoted before the checks of the stopped master")
	}
	h.waitFailover(t)
	wait.For(t, "a clear after the failover", func() bool { return h.idx.ClearPod(ctx, pod) == nil })
	// The write also needs the masters that never stopped; on a loaded
	// machine one of them can miss the 500 ms call deadline right after the
	// failover (CI saw it once), and it is then refused at once until it
	// answers a PING. That is the guard working, so the write is retried
	// until the guard lets it through, never past the wait's deadline.
	wait.For(t, "a write after the failover", func() bool { return h.idx.Add(ctx, h.m, pod, event.TierGPU, off) == nil })
	if err := h.idx.Healthy(ctx); err != nil {
		t.Fatalf("Healthy after the failover: %v", err)
	}
	if n, err := h.idx.PodBlocks(ctx, pod); err != nil || n != int64(len(off)) {
		t.Fatalf("PodBlocks after the failover: %d, %v", n, err)
	}
}
