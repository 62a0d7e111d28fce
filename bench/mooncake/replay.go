package mooncake

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// RunConfig is one open-loop replay of a corpus.
type RunConfig struct {
	// Window is the replay window every worker's timeline is scaled to:
	// the offered load is the corpus's ops over Window.
	Window time.Duration
	// EventWorkers apply event batches, each worker's batches on one of them
	// in order (the subscriber's per-pod workers); 0 = GOMAXPROCS, the
	// daemon's default.
	EventWorkers int
	// QueryLanes run queries, each worker's on one lane in order
	// (mooncake_bench's persistent query lanes); 0 = 128.
	QueryLanes int
}

// Result is one replay, in mooncake_bench's terms.
type Result struct {
	Window    time.Duration
	Elapsed   time.Duration // start to the last completion
	IssueSpan time.Duration // start to the last operation handed to its lane
	// CPU is the process's CPU time during the replay: the lanes, GC and
	// the issuer, which yields in a loop while it waits for a deadline
	// less than a timer's slack away (so it is busy whenever the lanes
	// leave the core idle).
	CPU time.Duration
	// SysCPU is the kernel's part of the process's CPU time (page faults
	// of freshly allocated tables, futex wake-ups).
	SysCPU time.Duration
	Totals Totals
	// GeneratorValid: every operation was issued within 1.01 x Window.
	// KeptUp additionally: everything completed within 1.10 x Window.
	GeneratorValid, KeptUp bool
	// Query service time (the Score call) and scheduled-to-finished, ns.
	Service, EndToEnd Dist
	// QueriesMatched counts queries that matched at least one block on some pod.
	QueriesMatched int64
	DecodeErrors   int64
	// IndexEntries and IndexKeys after the replay; HeapBytes is the live
	// heap the indexer added (after a GC, the corpus excluded).
	IndexEntries, IndexKeys int64
	HeapBytes               int64
	// PodEntries is what the index holds per worker after the replay.
	PodEntries []int64
}

// Dist is a latency distribution in nanoseconds (nearest rank).
type Dist struct{ P50, P99, P999, Max int64 }

func dist(v []int64) Dist {
	if len(v) == 0 {
		return Dist{}
	}
	slices.Sort(v)
	rank := func(num, den int) int64 {
		r := (len(v)*num + den - 1) / den
		return v[max(r, 1)-1]
	}
	return Dist{P50: rank(50, 100), P99: rank(99, 100), P999: rank(999, 1000), Max: v[len(v)-1]}
}

func rate(n int64, d time.Duration) float64 { return float64(n) / max(d, 1).Seconds() }

// OfferedLogical and the rest are per-second rates in both units.
func (r *Result) OfferedLogical() float64  { return rate(r.Totals.Logical(), r.Window) }
func (r *Result) AchievedLogical() float64 { return rate(r.Totals.Logical(), r.Elapsed) }
func (r *Result) OfferedBlocks() float64   { return rate(r.Totals.Blocks(), r.Window) }
func (r *Result) AchievedBlocks() float64  { return rate(r.Totals.Blocks(), r.Elapsed) }

// lane is one consumer's queue: the issuer appends operation indexes and
// publishes the count; the consumer sleeps on wake only when it caught up.
type lane struct {
	ops      []uint32
	pub      atomic.Int64
	sleeping atomic.Bool
	closed   atomic.Bool
	wake     chan struct{}
	_        [64]byte
}

func (l *lane) push(n int, i uint32) {
	l.ops[n] = i
	l.pub.Store(int64(n + 1))
	if l.sleeping.Load() {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// next returns how many operations are published, waiting for more when
// the consumer has done them all; -1 when the lane is closed and drained.
func (l *lane) next(done int64) int64 {
	for {
		if n := l.pub.Load(); n > done {
			return n
		}
		if l.closed.Load() {
			if n := l.pub.Load(); n > done {
				return n
			}
			return -1
		}
		l.sleeping.Store(true)
		if l.pub.Load() == done && !l.closed.Load() {
			<-l.wake
		}
		l.sleeping.Store(false)
	}
}

func (l *lane) close() {
	l.closed.Store(true)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// yieldEvery is how much work a lane does between yields: the issuer's
// timer wakes it on some core, where it waits for a lane to yield or be
// preempted (10 ms), and every operation it has not handed over yet is
// late by that much.
const yieldEvery = int64(50 * time.Microsecond)

// yieldNow yields when a lane has worked yieldEvery since it last did
// (last), and returns when it last yielded.
func yieldNow(last, t int64) int64 {
	if t-last < yieldEvery {
		return last
	}
	runtime.Gosched()
	return t
}

// Replay runs c open-loop against a fresh indexer: every operation is handed
// to its lane at its deadline whether or not earlier ones finished. Events
// enter as the daemon's do after the socket: each batch is the engine's vLLM
// message, decoded by kvevents.Decode and applied through the indexer's
// Sink (the applier, then the in-memory index); queries are indexer.Score.
func Replay(ctx context.Context, c *Corpus, rc RunConfig) (*Result, error) {
	if rc.EventWorkers <= 0 {
		rc.EventWorkers = runtime.GOMAXPROCS(0)
	}
	if rc.QueryLanes <= 0 {
		rc.QueryLanes = 128
	}
	if rc.Window <= 0 {
		return nil, fmt.Errorf("mooncake: replay window must be positive")
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := int64(ms.HeapAlloc)

	e, err := newEnv(ctx, c)
	if err != nil {
		return nil, err
	}
	defer e.ix.Close()
	ix, sink, pods := e.ix, e.ix.Sink(), e.pods

	// Lanes are numbered event workers first, then query lanes; each
	// worker's events go to one event worker, its queries to one lane.
	lanes := make([]lane, rc.EventWorkers+rc.QueryLanes)
	evl, ql := lanes[:rc.EventWorkers], lanes[rc.EventWorkers:]
	laneOf := func(o op) int {
		if o.kind == opQuery {
			return rc.EventWorkers + int(o.worker%uint32(rc.QueryLanes))
		}
		return int(o.worker % uint32(rc.EventWorkers))
	}
	written := make([]int, len(lanes))
	for _, o := range c.ops {
		written[laneOf(o)]++
	}
	for i := range lanes {
		lanes[i].ops = make([]uint32, written[i])
		lanes[i].wake = make(chan struct{}, 1)
		written[i] = 0
	}
	nq := len(c.qoff) - 1
	sched := make([]int64, nq) // query -> scheduled ns since epoch
	service := make([]int64, nq)
	finish := make([]int64, nq)
	epoch := time.Now()
	now := func() int64 { return int64(time.Since(epoch)) }

	var wg sync.WaitGroup
	var lastDone atomic.Int64
	var matched, decodeErrs atomic.Int64
	doneAt := func(t int64) {
		for {
			cur := lastDone.Load()
			if t <= cur || lastDone.CompareAndSwap(cur, t) {
				return
			}
		}
	}
	for i := range evl {
		l := &evl[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b event.Batch
			var done, lastYield int64
			for {
				n := l.next(done)
				if n < 0 {
					break
				}
				for ; done < n; done++ {
					o := c.ops[l.ops[done]]
					if _, err := kvevents.Decode(c.pay[c.poff[o.idx]:c.poff[o.idx+1]], blockkeys.EngineVLLM, &b); err != nil {
						decodeErrs.Add(1)
						continue
					}
					b.Pod, b.Model, b.Engine, b.Seq = pods[o.worker], Model, blockkeys.EngineVLLM, uint64(o.idx)
					sink.Apply(ctx, &b)
					lastYield = yieldNow(lastYield, now())
				}
				doneAt(now())
			}
		}()
	}
	for i := range ql {
		l := &ql[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res indexer.Result
			q := indexer.Query{Model: Model, Kind: indexer.InputHashes}
			if c.Cfg.Tokens {
				q.Kind = indexer.InputTokens
			}
			var toks []uint32
			var done, lastYield int64
			var hits int64
			for {
				n := l.next(done)
				if n < 0 {
					break
				}
				for ; done < n; done++ {
					o := c.ops[l.ops[done]]
					lo, hi := c.qoff[o.idx], c.qoff[o.idx+1]
					if c.Cfg.Tokens {
						toks = toks[:0]
						bs := c.Cfg.BlockSize
						for _, id := range c.qids[lo:hi] {
							toks = slices.Grow(toks, bs)[:len(toks)+bs]
							Tokens(toks[len(toks)-bs:], uint64(id))
						}
						q.TokenIDs = toks
					} else {
						q.BlockHashes = c.qkeys[lo:hi]
					}
					t0 := now()
					err := ix.Score(ctx, &q, &res)
					t1 := now()
					service[o.idx], finish[o.idx] = t1-t0, t1
					if err == nil && len(res.Pods) > 0 && res.Pods[0].MatchedBlocks > 0 {
						hits++
					}
					lastYield = yieldNow(lastYield, t1)
				}
				doneAt(now())
			}
			matched.Add(hits)
		}()
	}

	// The issuer: this goroutine, sleeping until the next deadline. A Go
	// timer wakes up to about a millisecond late; the issuer then hands
	// over at once everything due by then, so it runs at most that much
	// behind and its cost is a wake-up per millisecond, not a busy wait
	// (which took a core's share from the lanes it feeds). It is not
	// locked to a thread: a locked goroutine that blocks hands its core to
	// another thread and back, a futex call each way.
	var ru0 cpuTime
	ru0.read()
	start := now() + int64(5*time.Millisecond)
	window := int64(rc.Window)
	var lastIssue int64
	for i, o := range c.ops {
		hi, lo := bits.Mul64(uint64(o.pos), uint64(window))
		dl := start + int64(hi<<32|lo>>32)
		if t := now(); t < dl {
			time.Sleep(time.Duration(dl - t))
		}
		if o.kind == opQuery {
			sched[o.idx] = dl
		}
		li := laneOf(o)
		lanes[li].push(written[li], uint32(i))
		written[li]++
		lastIssue = now()
	}
	for i := range lanes {
		lanes[i].close()
	}
	wg.Wait()
	var ru1 cpuTime
	ru1.read()

	r := &Result{Window: rc.Window, Totals: c.Totals, CPU: ru1.sub(ru0), SysCPU: ru1.sys - ru0.sys,
		Elapsed: time.Duration(lastDone.Load() - start), IssueSpan: time.Duration(lastIssue - start),
		QueriesMatched: matched.Load(), DecodeErrors: decodeErrs.Load()}
	r.GeneratorValid = r.IssueSpan <= r.Window*101/100 && r.DecodeErrors == 0
	r.KeptUp = r.GeneratorValid && r.Elapsed <= r.Window*110/100
	for i := range finish {
		finish[i] -= sched[i]
	}
	r.Service, r.EndToEnd = dist(service), dist(finish)
	st := e.mem.Stats()
	r.IndexEntries, r.IndexKeys = st.Entries, st.Keys
	r.PodEntries = e.podEntries()
	service, finish, sched = nil, nil, nil
	runtime.GC()
	runtime.ReadMemStats(&ms)
	r.HeapBytes = int64(ms.HeapAlloc) - heap0
	runtime.KeepAlive(ix)
	return r, nil
}

// env is a fresh indexer on an in-memory index sized for c, as the daemon
// would run it, and the workers' pod names.
type env struct {
	mem      *kvindex.MemoryIndex
	ix       *indexer.Indexer
	interner *kvindex.Interner
	pods     []string
}

func newEnv(ctx context.Context, c *Corpus) (*env, error) {
	nWorkers := len(c.Resident)
	capacity := max(int64(kvindex.DefaultMemoryCapacity), 2*int64(nWorkers)*int64(c.Cfg.Capacity))
	e := &env{mem: kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: capacity})}
	ix, err := indexer.New(ctx, indexer.Config{Keys: c.Cfg.KeyConfig(),
		Backend: func(_ context.Context, in *kvindex.Interner) (indexer.Backend, error) {
			e.interner = in
			return indexer.MemoryBackend(e.mem), nil
		}})
	if err != nil {
		return nil, err
	}
	e.ix = ix
	e.pods = make([]string, nWorkers)
	for w := range e.pods {
		e.pods[w] = "worker-" + strconv.Itoa(w)
	}
	return e, nil
}

// podEntries is what the index holds per worker.
func (e *env) podEntries() []int64 {
	out := make([]int64, len(e.pods))
	for w, p := range e.pods {
		if id, ok := e.interner.LookupPod(p, 0); ok {
			out[w] = e.mem.PodEntries(id)
		}
	}
	return out
}
