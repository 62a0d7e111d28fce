package redisindex

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

func testHashers(t *testing.T) *blockkeys.HasherSet {
	t.Helper()
	hs, err := blockkeys.NewHasherSet(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, BlockSize: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

func tokens(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*1000 + uint32(i)
	}
	return out
}

// storedEvent is what vLLM publishes for toks: one BlockStored whose block
// hashes are the keys (the default 64-bit wire form), with token ids.
func storedEvent(keys []blockkeys.Key, toks []uint32) event.Event {
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = uint64(k)
	}
	return event.Event{Kind: event.BlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: 4}
}

// The Applier error contract end to end on a real Redis: a write lost while
// Redis is down marks the pod untrusted; Redis comes back WITH the pod's old
// (now wrong) state; the pod's next batch resets it before anything new is
// written, so the stale blocks are never scored again, and the new ones are.
func TestApplierRecoversAfterRedisLoss(t *testing.T) {
	s := redistest.Start(t)
	in := kvindex.NewInterner()
	idx, err := New(context.Background(), Config{URL: s.URL(), Namespace: redistest.UniqueNS(t), Interner: in,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, StatsRefresh: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	hs := testHashers(t)
	ap, err := applier.New(applier.Config{Index: idx, Interner: in, Hashers: hs})
	if err != nil {
		t.Fatal(err)
	}
	sc := kvindex.NewScorer(idx, nil, kvindex.DefaultTierWeights())
	ctx := context.Background()
	m := in.Model("m")
	h := hs.For("m")

	t1 := tokens(32, 1)
	k1 := h.Keys(nil, t1, blockkeys.RequestExtras{})
	ap.Apply(context.Background(), &event.Batch{Pod: "p", Model: "m", Seq: 0, Events: []event.Event{storedEvent(k1, t1)}})
	pod, _ := in.LookupPod("p", 0)
	var res kvindex.ScoreResult
	if err := sc.Score(ctx, m, k1, nil, &res); err != nil || len(res.Pods) != 1 || res.Pods[0].MatchedBlocks != 8 {
		t.Fatalf("before loss: %v %+v", err, res)
	}
	// Persist this state, then lose Redis: the eviction of blocks 4..7
	// cannot be written.
	if _, err := s.Do("SAVE"); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	hs8 := make([]uint64, 4)
	for i := range hs8 {
		hs8[i] = uint64(k1[4+i])
	}
	ap.Apply(context.Background(), &event.Batch{Pod: "p", Model: "m", Seq: 1, Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: hs8}}})
	if err := sc.Score(ctx, m, k1, nil, &res); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("score with redis down = %v, want ErrUnavailable", err)
	}
	st := podStats(ap, "p")
	if !st.Untrusted || st.IndexErrors == 0 {
		t.Fatalf("pod stats after failed write: %+v", st)
	}

	// Redis comes back with the saved (stale) state: blocks 4..7 present.
	s.Restart()
	wait.For(t, "healthy", func() bool { return idx.Healthy(ctx) == nil })
	// The pod's next batch: the applier clears it first, then applies.
	t2 := tokens(8, 2)
	k2 := h.Keys(nil, t2, blockkeys.RequestExtras{})
	ap.Apply(context.Background(), &event.Batch{Pod: "p", Model: "m", Seq: 2, Events: []event.Event{storedEvent(k2, t2)}})
	st = podStats(ap, "p")
	if st.Untrusted {
		t.Fatalf("pod still untrusted after Redis is back: %+v", st)
	}
	if err := sc.Score(ctx, m, k1, nil, &res); err != nil || len(res.Pods) != 0 {
		t.Fatalf("stale blocks served after reset: %v %+v", err, res)
	}
	if err := sc.Score(ctx, m, k2, nil, &res); err != nil || len(res.Pods) != 1 || res.Pods[0].Pod != pod || res.Pods[0].MatchedBlocks != 2 {
		t.Fatalf("rebuilt state: %v %+v", err, res)
	}
	if n, err := idx.PodBlocks(ctx, pod); err != nil || n != 2 {
		t.Fatalf("PodBlocks after rebuild = %d, %v", n, err)
	}
}

func podStats(ap *applier.Applier, pod string) applier.PodStats {
	for _, s := range ap.PodStats() {
		if s.Pod == pod {
			return s
		}
	}
	return applier.PodStats{}
}

// The same randomized event stream applied through the Applier to the memory
// index and to Redis (single node and cluster) scores identically.
func TestScorerRedisMatchesMemory(t *testing.T) {
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		name, url string
		walk      bool
	}{{"single", single.URL(), false}, {"single-server-walk", single.URL(), true}, {"cluster", cluster.URL(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			hs := testHashers(t)
			inM, inR := kvindex.NewInterner(), kvindex.NewInterner()
			mem := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
			red, _ := newTestIndex(t, tc.url, func(c *Config) { c.Interner = inR; c.ServerWalk = tc.walk })
			apM, err := applier.New(applier.Config{Index: mem, Interner: inM, Hashers: hs})
			if err != nil {
				t.Fatal(err)
			}
			apR, err := applier.New(applier.Config{Index: red, Interner: inR, Hashers: hs})
			if err != nil {
				t.Fatal(err)
			}
			scM := kvindex.NewScorer(mem, mem, kvindex.DefaultTierWeights())
			// The scorer has a fused fast path for *MemoryIndex; hiding the
			// type makes it use the generic Lookup/Visit path, as for Redis.
			scG := kvindex.NewScorer(struct{ kvindex.Index }{mem}, nil, kvindex.DefaultTierWeights())
			scR := kvindex.NewScorer(red, nil, kvindex.DefaultTierWeights())
			h := hs.For("m")
			rng := rand.New(rand.NewSource(42))
			compared, nonEmpty := 0, 0

			// Prompts share prefixes: 6 system prompts x user suffixes.
			var prompts [][]uint32
			for sys := range 6 {
				base := tokens(4*(4+rng.Intn(12)), uint32(100+sys))
				for u := range 5 {
					p := slices.Clone(base)
					p = append(p, tokens(4*(1+rng.Intn(10)), uint32(1000+sys*10+u))...)
					prompts = append(prompts, p)
				}
			}
			pods := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
			seq := map[string]uint64{}
			apply := func(pod string, evs ...event.Event) {
				b := event.Batch{Pod: pod, Model: "m", Seq: seq[pod], Events: evs}
				seq[pod]++
				apM.Apply(context.Background(), &b)
				b2 := b
				apR.Apply(context.Background(), &b2)
			}
			for step := range 250 {
				pod := pods[rng.Intn(len(pods))]
				p := prompts[rng.Intn(len(prompts))]
				keys := h.Keys(nil, p, blockkeys.RequestExtras{})
				switch r := rng.Intn(20); {
				case r < 13:
					ev := storedEvent(keys, p)
					ev.Medium = event.Tier(rng.Intn(3))
					apply(pod, ev)
				case r < 19:
					from := rng.Intn(len(keys))
					hsh := make([]uint64, 0, len(keys)-from)
					for _, k := range keys[from:] {
						hsh = append(hsh, uint64(k))
					}
					apply(pod, event.Event{Kind: event.BlockRemoved, BlockHashes: hsh, Medium: event.Tier(rng.Intn(3))})
				default:
					apply(pod, event.Event{Kind: event.AllBlocksCleared})
				}
				if step%10 != 9 {
					continue
				}
				for _, p := range prompts {
					keys := h.Keys(nil, p, blockkeys.RequestExtras{})
					var cands []kvindex.PodID
					var candsR []kvindex.PodID
					if rng.Intn(2) == 0 {
						for _, name := range pods[:4] {
							cands = append(cands, inM.Pod(name, 0))
							candsR = append(candsR, inR.Pod(name, 0))
						}
					}
					var rm, rr kvindex.ScoreResult
					if err := scM.Score(ctx, inM.Model("m"), keys, cands, &rm); err != nil {
						t.Fatal(err)
					}
					if err := scR.Score(ctx, inR.Model("m"), keys, candsR, &rr); err != nil {
						t.Fatal(err)
					}
					compared++
					if len(rm.Pods) > 0 {
						nonEmpty++
					}
					var rg kvindex.ScoreResult
					if err := scG.Score(ctx, inM.Model("m"), keys, cands, &rg); err != nil {
						t.Fatal(err)
					}
					// Index contents first: the holders of every key.
					if a, b := dump(t, mem, inM, keys), dump(t, red, inR, keys); a != b {
						t.Fatalf("step %d: index contents differ\nmemory %s\nredis  %s", step, a, b)
					}
					if a, b := render(inM, rg), render(inR, rr); a != b {
						t.Fatalf("step %d: scores differ\nmemory (generic path) %s\nredis                 %s", step, a, b)
					}
					if a, b := render(inM, rm), render(inR, rr); a != b {
						t.Fatalf("step %d: scores differ\nmemory %s\nredis  %s", step, a, b)
					}
				}
			}
			// Equal empty answers would prove nothing: most must hold pods.
			if nonEmpty*2 < compared {
				t.Fatalf("only %d of %d score results were non-empty", nonEmpty, compared)
			}
			for _, name := range pods {
				nm, _ := mem.PodBlocks(ctx, inM.Pod(name, 0))
				nr, err := red.PodBlocks(ctx, inR.Pod(name, 0))
				if err != nil || nm != nr {
					t.Fatalf("PodBlocks(%s): memory %d, redis %d (%v)", name, nm, nr, err)
				}
			}
		})
	}
}

// render prints a result by pod name (ids differ between interners). Pods
// with equal scores are ordered by name so the order does not depend on ids.
func render(in *kvindex.Interner, r kvindex.ScoreResult) string {
	type row struct {
		name string
		ps   kvindex.PodScore
	}
	rows := make([]row, len(r.Pods))
	for i, p := range r.Pods {
		n, _ := in.PodName(p.Pod)
		rows[i] = row{n, p}
	}
	slices.SortStableFunc(rows, func(a, b row) int {
		if a.ps.Score != b.ps.Score {
			if a.ps.Score > b.ps.Score {
				return -1
			}
			return 1
		}
		if a.ps.MatchedBlocks != b.ps.MatchedBlocks {
			return b.ps.MatchedBlocks - a.ps.MatchedBlocks
		}
		if a.name < b.name {
			return -1
		}
		return 1
	})
	out := "total=" + strconv.Itoa(r.TotalBlocks)
	for _, x := range rows {
		out += " " + x.name + ":" + strconv.Itoa(x.ps.MatchedBlocks) + "/" + strconv.FormatFloat(x.ps.Score, 'g', -1, 64) + "/" + strconv.Itoa(int(x.ps.TierBlocks[0])) + "," + strconv.Itoa(int(x.ps.TierBlocks[1])) + "," + strconv.Itoa(int(x.ps.TierBlocks[2])) +
			fmt.Sprintf(" runs%v", x.ps.TierRuns)
	}
	return out
}

// dump renders Lookup's visits by pod name.
func dump(t *testing.T, idx kvindex.Index, in *kvindex.Interner, keys []blockkeys.Key) string {
	out := ""
	for _, v := range indextest.Lookup(t, idx, in.Model("m"), keys, -1) {
		names := make([]string, len(v.Holders))
		for i, h := range v.Holders {
			n, _ := in.PodName(h.Pod)
			names[i] = n + "/" + h.Tier.String()
		}
		slices.Sort(names)
		out += strconv.Itoa(v.I) + ":" + fmt.Sprint(names) + " "
	}
	return out
}
