package leases

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/redis/go-redis/v9"
)

func newIndex(t *testing.T, url, ns string) (*redisindex.Index, *kvindex.Interner) {
	t.Helper()
	in := kvindex.NewInterner()
	idx, err := redisindex.New(context.Background(), redisindex.Config{URL: url, Namespace: ns, Interner: in, StatsRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	return idx, in
}

// holders renders the live holders of key 1 of model m as "name/rank ...".
type holders struct {
	in  *kvindex.Interner
	out []string
}

func (h *holders) Visit(_ int, _ blockkeys.Key, hs []kvindex.Holder) bool {
	for _, x := range hs {
		name, rank := h.in.PodName(x.Pod)
		h.out = append(h.out, fmt.Sprintf("%s/%d", name, rank))
	}
	return false
}

func livePods(t *testing.T, idx kvindex.Index, in *kvindex.Interner) string {
	t.Helper()
	h := &holders{in: in}
	if err := idx.Lookup(context.Background(), in.Model("m"), []blockkeys.Key{1}, h); err != nil {
		t.Fatal(err)
	}
	slices.Sort(h.out)
	return strings.Join(h.out, " ")
}

// TestTakeoverClearsWhatTheOwnerIndexed: daemon a owns two endpoints, one
// configured with pod=pod-x (whose engine publishes DP ranks 0..2), one
// naming its pod by topic (eng-t, ranks 0 and 1). a dies without releasing
// anything. b, whose interner has never seen any of these pods, takes both
// endpoints over and must clear every (pod, rank) a indexed from them, and
// nothing else.
//
// The takeover this replaced cleared through the taker's interner with a
// rank-0 fallback and only for configured names: here it would have left
// pod-x/1, pod-x/2 and both eng-t ranks in the index.
func TestTakeoverClearsWhatTheOwnerIndexed(t *testing.T) {
	s := redistest.Start(t)
	ns := redistest.UniqueNS(t)
	ctx := context.Background()
	const epPod, epTopic = "tcp://10.0.0.1:5557", "tcp://10.0.0.2:5557"
	configured := map[string]string{epPod: "pod-x", epTopic: ""}
	eps := func() []string { return []string{epPod, epTopic} }
	const ttl = 1500 * time.Millisecond

	// a's subscriber, as far as the index and the takeover see it: the
	// streams each endpoint delivers once subscribed.
	idxA, inA := newIndex(t, s.URL(), ns)
	streams := map[string][]kvindex.PodID{
		epPod:   {inA.Pod("pod-x", 0), inA.Pod("pod-x", 1), inA.Pod("pod-x", 2)},
		epTopic: {inA.Pod("eng-t", 0), inA.Pod("eng-t", 1)},
	}
	var mu sync.Mutex
	subscribed := map[string]bool{}
	seenA := func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]string{}
		for ep := range subscribed {
			for _, p := range streams[ep] {
				name, _ := inA.PodName(p)
				out[ep] = append(out[ep], name)
			}
		}
		return out
	}
	// A pod no lease covers (another daemon's bind socket): never cleared.
	if err := idxA.Add(ctx, inA.Model("m"), inA.Pod("bystander", 0), event.TierGPU, []blockkeys.Key{1}); err != nil {
		t.Fatal(err)
	}

	ca := newClient(s)
	a := NewManager(ca, ns, "daemon-a", ttl)
	a.SetLogger(quiet)
	toA := NewTakeover(ca, ns)
	ctxA, cancelA := context.WithCancel(ctx)
	var wgA sync.WaitGroup
	wgA.Go(func() { toA.Track(ctxA, 50*time.Millisecond, a.Held, seenA, func(error) {}) })
	wgA.Go(func() {
		_ = a.Run(ctxA, eps, func(ctx context.Context, ep string) error {
			if err := toA.Prepare(ctx, ep, configured[ep], idxA); err != nil {
				return err
			}
			for _, p := range streams[ep] {
				if err := idxA.Add(ctx, inA.Model("m"), p, event.TierGPU, []blockkeys.Key{1}); err != nil {
					return err
				}
			}
			mu.Lock()
			subscribed[ep] = true
			mu.Unlock()
			return nil
		}, func(string) {})
	})
	wait.For(t, "a records the pods of both endpoints", func() bool {
		p, _ := toA.Recorded(ctx, epPod)
		q, _ := toA.Recorded(ctx, epTopic)
		return slices.Equal(p, []string{"pod-x"}) && slices.Equal(q, []string{"eng-t"})
	})
	if got, want := livePods(t, idxA, inA), "bystander/0 eng-t/0 eng-t/1 pod-x/0 pod-x/1 pod-x/2"; got != want {
		t.Fatalf("before the takeover: %q, want %q", got, want)
	}

	// a dies: its client goes away, so nothing is released or cleared.
	ca.Close()
	cancelA()
	wgA.Wait()

	idxB, inB := newIndex(t, s.URL(), ns)
	cb := newClient(s)
	defer cb.Close()
	b := NewManager(cb, ns, "daemon-b", ttl)
	b.SetLogger(quiet)
	toB := NewTakeover(cb, ns)
	ctxB, cancelB := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Run(ctxB, eps, func(ctx context.Context, ep string) error {
			return toB.Prepare(ctx, ep, configured[ep], idxB)
		}, func(string) {})
	}()
	defer func() { cancelB(); <-done }()
	wait.For(t, "b takes both endpoints over", func() bool { return len(b.Held()) == 2 })
	if got := livePods(t, idxB, inB); got != "bystander/0" {
		t.Fatalf("after the takeover b serves %q, want only bystander/0", got)
	}
	for _, ep := range eps() {
		if names, err := toB.Recorded(ctx, ep); err != nil || len(names) != 0 {
			t.Fatalf("record of %s after the takeover: %v %v (want forgotten)", ep, names, err)
		}
	}
}

// TestRecordBounded: the names recorded per endpoint are capped, and the
// cap is reported rather than silently applied. On Cluster too: the
// endpoints' records live on different nodes.
func TestRecordBounded(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		c := newClient(redistest.Start(t))
		defer c.Close()
		testRecordBounded(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		var addrs []string
		for _, n := range cl.Nodes {
			addrs = append(addrs, n.Addr())
		}
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Protocol: 2, DisableIdentity: true})
		defer c.Close()
		testRecordBounded(t, c)
	})
}

func testRecordBounded(t *testing.T, c redis.UniversalClient) {
	ctx := context.Background()
	ns := redistest.UniqueNS(t)
	to := NewTakeover(c, ns)
	to.maxNames = 3
	if err := to.Record(ctx, map[string][]string{"e{1}": {"a", "b", "a"}, "e2": {"z"}}); err != nil {
		t.Fatal(err)
	}
	err := to.Record(ctx, map[string][]string{"e{1}": {"a", "c", "d", "e"}, "e2": {"y"}})
	if err == nil || !strings.Contains(err.Error(), "e{1}") || strings.Contains(err.Error(), "e2") {
		t.Fatalf("over the cap: err = %v, want one naming e{1} only", err)
	}
	got1, _ := to.Recorded(ctx, "e{1}")
	got2, _ := to.Recorded(ctx, "e2")
	if len(got1) != 3 || !slices.Contains(got1, "a") || !slices.Contains(got1, "b") || !slices.Equal(got2, []string{"y", "z"}) {
		t.Fatalf("recorded %v and %v", got1, got2)
	}
	// Prepare clears every recorded name and the configured one, then
	// forgets the record.
	var cleared clearLog
	if err := to.Prepare(ctx, "e2", "cfg", &cleared); err != nil {
		t.Fatal(err)
	}
	if want := []string{"cfg", "y", "z"}; !slices.Equal(cleared.sorted(), want) {
		t.Fatalf("cleared %v, want %v", cleared.sorted(), want)
	}
	if got, _ := to.Recorded(ctx, "e2"); len(got) != 0 {
		t.Fatalf("record after Prepare: %v", got)
	}
	// A failed clear forgets nothing (the next attempt clears again).
	cleared = clearLog{fail: true}
	if err := to.Prepare(ctx, "e{1}", "", &cleared); err == nil {
		t.Fatal("Prepare with a failing clear: no error")
	}
	if got, _ := to.Recorded(ctx, "e{1}"); len(got) != 3 {
		t.Fatalf("record after a failed Prepare: %v, want the 3 names kept", got)
	}
}

type clearLog struct {
	mu    sync.Mutex
	names []string
	fail  bool
}

func (c *clearLog) ClearPodsNamed(_ context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return fmt.Errorf("index unavailable")
	}
	c.names = append(c.names, name)
	return nil
}

func (c *clearLog) sorted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(slices.Values(c.names))
}
