package redisindex

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// gateHook holds the first pipeline sent after arm() until release is
// closed, so a test can queue writes behind a flush that is on the wire.
type gateHook struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGate() *gateHook {
	return &gateHook{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if g.armed.CompareAndSwap(true, false) {
			close(g.entered)
			<-g.release
		}
		return next(ctx, cmds)
	}
}

// Writes that arrive while a flush is on the wire are sent together by the
// next flush: 1 + K concurrent Adds of K+1 pods cost 2 flushes (4 round
// trips on a single node instead of 2 per Add), and every write lands.
func TestWritesCoalesce(t *testing.T) {
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			url, _ := startRedis(t, mode)
			gate := newGate()
			idx, in, rt := newCountedIndex(t, url, nil, gate)
			ctx := context.Background()
			m := in.Model("m")
			keys := seqKeys(32, 9<<40)
			// Warm: scripts loaded, epochs cached, cluster slots known.
			if err := idx.Add(ctx, m, in.Pod("warm", 0), event.TierGPU, keys[:1]); err != nil {
				t.Fatal(err)
			}
			if err := idx.Healthy(ctx); err != nil {
				t.Fatal(err)
			}

			const K = 6
			w0 := idx.WriteStats()
			rt.Reset()
			gate.armed.Store(true)
			var wg sync.WaitGroup
			errs := make(chan error, K+1)
			add := func(p int) {
				defer wg.Done()
				errs <- idx.Add(ctx, m, in.Pod("p"+strconv.Itoa(p), 0), event.TierGPU, keys[:8*(p%4+1)])
			}
			wg.Add(1)
			go add(0)
			<-gate.entered // pod 0's flush is on the wire, held
			for p := 1; p <= K; p++ {
				wg.Add(1)
				go add(p)
			}
			wait.For(t, "writes queued behind the held flush", func() bool { return idx.pendingWrites() == K })
			close(gate.release)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			w := idx.WriteStats()
			if got := w.Requests - w0.Requests; got != K+1 {
				t.Fatalf("%d write requests, want %d", got, K+1)
			}
			if got := w.Flushes - w0.Flushes; got != 2 {
				t.Fatalf("%d flushes for %d concurrent adds, want 2 (the held one, then all the queued ones)", got, K+1)
			}
			if mode == "single" {
				// scripts + counters per flush
				if got := rt.Load(); got != 4 {
					t.Fatalf("%d round trips for %d adds in 2 flushes, want 4", got, K+1)
				}
			}
			for p := 0; p <= K; p++ {
				pod := in.Pod("p"+strconv.Itoa(p), 0)
				want := int64(8 * (p%4 + 1))
				if n, err := idx.PodBlocks(ctx, pod); err != nil || n != want {
					t.Fatalf("pod %d holds %d blocks (%v), want %d", p, n, err, want)
				}
			}
			got := indextest.Lookup(t, idx, m, keys, -1)
			for i, v := range got {
				// block i is held by "warm" (block 0) and by every pod
				// whose prefix reaches it
				want := 0
				if i == 0 {
					want = 1
				}
				for p := 0; p <= K; p++ {
					if i < 8*(p%4+1) {
						want++
					}
				}
				if len(v.Holders) != want {
					t.Fatalf("block %d: %d holders, want %d", i, len(v.Holders), want)
				}
			}
		})
	}
}

// Per-pod order survives coalescing: each pod's goroutine runs a sequence
// of adds and removes whose result depends on their order, concurrently
// with the other pods (so their writes share flushes); every pod ends with
// exactly the blocks its sequence leaves.
func TestCoalescedWritesKeepPodOrder(t *testing.T) {
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			url, _ := startRedis(t, mode)
			idx, in := newTestIndex(t, url, nil)
			ctx := context.Background()
			m := in.Model("m")
			keys := seqKeys(40, 5<<40)
			const pods, rounds = 8, 10
			var wg sync.WaitGroup
			errs := make(chan error, pods)
			w0 := idx.WriteStats()
			for p := range pods {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pod := in.Pod("p"+strconv.Itoa(p), 0)
					for r := range rounds {
						steps := []struct {
							remove bool
							ks     []blockkeys.Key
						}{{false, keys}, {true, keys[10:]}, {false, keys[20:30]}, {true, keys[:5]}}
						if r == rounds-1 && p%2 == 1 {
							// odd pods end differently: order matters
							steps = append(steps, struct {
								remove bool
								ks     []blockkeys.Key
							}{true, keys[20:25]})
						}
						for _, s := range steps {
							var err error
							if s.remove {
								err = idx.Remove(ctx, m, pod, event.TierGPU, s.ks)
							} else {
								err = idx.Add(ctx, m, pod, event.TierGPU, s.ks)
							}
							if err != nil {
								errs <- err
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			held := make([]map[kvindex.PodID]bool, len(keys))
			for i, k := range keys {
				held[i] = map[kvindex.PodID]bool{}
				for _, v := range indextest.Lookup(t, idx, m, []blockkeys.Key{k}, -1) {
					for _, h := range v.Holders {
						held[i][h.Pod] = true
					}
				}
			}
			for p := range pods {
				pod := in.Pod("p"+strconv.Itoa(p), 0)
				n := 0
				for i := range keys {
					want := (i >= 5 && i < 10) || (i >= 20 && i < 30)
					if p%2 == 1 && i >= 20 && i < 25 {
						want = false
					}
					if held[i][pod] != want {
						t.Fatalf("pod %d, block %d: held=%v, want %v", p, i, held[i][pod], want)
					}
					if want {
						n++
					}
				}
				if got, err := idx.PodBlocks(ctx, pod); err != nil || got != int64(n) {
					t.Fatalf("pod %d: PodBlocks %d (%v), want %d", p, got, err, n)
				}
			}
			w := idx.WriteStats()
			t.Logf("%d writes in %d flushes", w.Requests-w0.Requests, w.Flushes-w0.Flushes)
		})
	}
}

// A block key left by the previous layout (a HASH per block) reads as
// absent, on a single node (MGET) and on Cluster (GET), and the next add
// replaces it: an upgrade needs no migration.
func TestOldLayoutKeyReplaced(t *testing.T) {
	for _, mode := range []string{"single", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			url, _ := startRedis(t, mode)
			idx, in := newTestIndex(t, url, nil)
			ctx := context.Background()
			m, p := in.Model("m"), in.Pod("p", 0)
			keys := seqKeys(2, 1)
			k := idx.Namespace() + ":b:m:0000000000000001"
			if err := idx.Client().HSet(ctx, k, "0.0.0.old", "1").Err(); err != nil {
				t.Fatal(err)
			}
			if got := indextest.Lookup(t, idx, m, keys, -1); len(got) != 0 {
				t.Fatalf("old-layout key visited: %v", got)
			}
			if err := idx.Add(ctx, m, p, event.TierGPU, keys); err != nil {
				t.Fatal(err)
			}
			got := indextest.Lookup(t, idx, m, keys, -1)
			if len(got) != 2 || len(got[0].Holders) != 1 || got[0].Holders[0].Pod != p {
				t.Fatalf("after add: %v", got)
			}
			if typ, _ := idx.Client().Type(ctx, k).Result(); typ != "string" {
				t.Fatalf("block key is a %s after add", typ)
			}
		})
	}
}

// A write larger than maxWriteKeys goes as consecutive requests, and a
// write of another pod queued meanwhile is flushed between them instead of
// waiting for the whole large write: 3 x maxWriteKeys + 5 keys are 4
// requests, and the other pod's Add, queued while the first is on the
// wire, is flushed before the last.
func TestLargeWriteIsChunked(t *testing.T) {
	url, _ := startRedis(t, "single")
	gate := newGate()
	flushes := &flushKeys{}
	idx, in, _ := newCountedIndex(t, url, nil, gate, flushes)
	ctx := context.Background()
	m := in.Model("m")
	big, other := in.Pod("big", 0), in.Pod("other", 0)
	keys := seqKeys(3*maxWriteKeys+5, 7<<40)
	if err := idx.Add(ctx, m, other, event.TierGPU, keys[:1]); err != nil { // warm: scripts, epochs
		t.Fatal(err)
	}
	flushes.reset()
	w0 := idx.WriteStats()
	gate.armed.Store(true)
	errs := make(chan error, 2)
	go func() { errs <- idx.Add(ctx, m, big, event.TierGPU, keys) }()
	<-gate.entered // the first chunk's flush is on the wire, held
	go func() { errs <- idx.Add(ctx, m, other, event.TierGPU, keys[1:2]) }()
	wait.For(t, "the other pod's write queued", func() bool { return idx.pendingWrites() == 1 })
	close(gate.release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if r := idx.WriteStats().Requests - w0.Requests; r != 5 {
		t.Fatalf("%d write requests, want 5 (4 chunks and the other pod's)", r)
	}
	seq := flushes.get()         // the requests' key counts of each flush, in order
	flushOf := func(n int) int { // the flush that carries a request of n keys
		return slices.IndexFunc(seq, func(f []int) bool { return slices.Contains(f, n) })
	}
	if other, last := flushOf(1), flushOf(5); other < 1 || last < 0 || other >= last || !slices.Equal(seq[0], []int{maxWriteKeys}) {
		t.Fatalf("requests per flush %v: want the other pod's 1-key write flushed after the first chunk and before the last (5 keys)", seq)
	}
	if n, err := idx.PodBlocks(ctx, big); err != nil || n != int64(len(keys)) {
		t.Fatalf("the large write left %d blocks (%v), want %d", n, err, len(keys))
	}
	if n, err := idx.PodBlocks(ctx, other); err != nil || n != 2 {
		t.Fatalf("the other pod holds %d blocks (%v), want 2", n, err)
	}
}

// flushKeys records, for every pipeline of block scripts (a flush's first
// pipeline, which starts with the HGET of the pods hash's version), the key
// count of each script run in it: on a single node, one run per request.
type flushKeys struct {
	mu      sync.Mutex
	flushes [][]int
}

func (f *flushKeys) reset()       { f.mu.Lock(); f.flushes = nil; f.mu.Unlock() }
func (f *flushKeys) get() [][]int { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.flushes) }

func (f *flushKeys) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *flushKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (f *flushKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "hget" {
			var runs []int
			for _, c := range cmds[1:] {
				if a := c.Args(); len(a) > 2 && (c.Name() == "evalsha" || c.Name() == "eval") {
					k, _ := a[2].(int)
					runs = append(runs, k)
				}
			}
			f.mu.Lock()
			f.flushes = append(f.flushes, runs)
			f.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}
