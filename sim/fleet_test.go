package sim

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/sim/cache"
)

// recRouter always picks pod 0 and records the KV events it is handed.
type recRouter struct {
	got []recEv
}

type recEv struct {
	pod int
	t   float64
	ops []kvOp
}

func (*recRouter) name() string              { return "rec" }
func (*recRouter) route(*Request, *view) int { return 0 }
func (r *recRouter) onKVEvents(p int, ops []kvOp, t float64) {
	r.got = append(r.got, recEv{p, t, ops})
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// One pod, B=1, prefill 1 ms/token, decode 10 ms/token, lag 0.5 s.
//
//	r1 t=0: L=1024 [1,2], out 10: prefill 1.024 s -> TTFT 1.024; decode to 1.124.
//	r2 t=0: waits for the slot until 1.124; [1,2] cached -> hit 1024, prefill 0,
//	        TTFT 1.124.
//	r3 t=0: [3], L=512 at 1.124 (r2's decode ends 1.224): capacity 2 LRU holds
//	        [1,2] (2 most recent) -> evicts 1, stores 3: ops Removed[1], Stored[3].
//	        prefill 0.512 -> ends 1.736, TTFT 1.736.
//
// Events: r1's Stored[1,2] at 1.024+0.5; r3's at 1.736+0.5; r2 stores nothing.
func TestSimulateServiceModelByHand(t *testing.T) {
	reqs := []Request{
		{Timestamp: 0, InputLength: 1024, OutputLength: 10, HashIDs: []uint64{1, 2}},
		{Timestamp: 0, InputLength: 1024, OutputLength: 10, HashIDs: []uint64{1, 2}},
		{Timestamp: 0, InputLength: 512, OutputLength: 10, HashIDs: []uint64{3}},
	}
	cfg := FleetConfig{Pods: 1, Cache: cache.Config{Policy: "lru", Capacity: 2}, BlockSize: 512, Speedup: 1, EventLag: 0.5,
		Service: ServiceModel{MaxBatch: 1, PrefillPerToken: 0.001, DecodePerToken: 0.01}}
	rr := &recRouter{}
	res, err := simulate(cfg, reqs, rr)
	if err != nil {
		t.Fatal(err)
	}
	wantTTFT := []float64{1.024, 1.124, 1.736}
	for i, w := range wantTTFT {
		if !near(res.TTFTs[i], w) {
			t.Fatalf("TTFTs %v, want %v", res.TTFTs, wantTTFT)
		}
	}
	if res.HitTokens != 1024 || res.PromptTokens != 2560 || !near(res.HitRate, 1024.0/2560) {
		t.Fatalf("hit %d/%d rate %v", res.HitTokens, res.PromptTokens, res.HitRate)
	}
	if !near(res.TTFTp50, 1.124) || !near(res.TTFTp99, 1.736) || res.PerPodMax != 3 || res.CacheBlocksUsed != 2 {
		t.Fatalf("p50 %v p99 %v max %d blocks %d", res.TTFTp50, res.TTFTp99, res.PerPodMax, res.CacheBlocksUsed)
	}
	if !near(res.Makespan, 1.736+0.1) {
		t.Fatalf("makespan %v, want 1.836", res.Makespan)
	}
	want := []recEv{
		{0, 1.524, []kvOp{{false, []uint64{1, 2}}}},
		{0, 2.236, []kvOp{{true, []uint64{1}}, {false, []uint64{3}}}},
	}
	if len(rr.got) != len(want) {
		t.Fatalf("events %+v, want %+v", rr.got, want)
	}
	for i := range want {
		if rr.got[i].pod != want[i].pod || !near(rr.got[i].t, want[i].t) || !reflect.DeepEqual(rr.got[i].ops, want[i].ops) {
			t.Fatalf("event %d: %+v, want %+v", i, rr.got[i], want[i])
		}
	}
}

// B=2 lets two requests in, but prefill is serialised: the second waits for
// the first's prefill, not for its decode.
func TestSimulatePrefillSerialisedDecodeConcurrent(t *testing.T) {
	reqs := []Request{
		{Timestamp: 0, InputLength: 1000, OutputLength: 100, HashIDs: []uint64{1, 2}},
		{Timestamp: 0, InputLength: 1000, OutputLength: 100, HashIDs: []uint64{7, 8}},
	}
	cfg := FleetConfig{Pods: 1, Cache: cache.Config{Policy: "lru", Capacity: 10}, BlockSize: 512, Speedup: 1,
		Service: ServiceModel{MaxBatch: 2, PrefillPerToken: 0.001, DecodePerToken: 0.01}}
	res, err := simulate(cfg, reqs, &recRouter{})
	if err != nil {
		t.Fatal(err)
	}
	// r1 prefill 0..1, r2 prefill 1..2 (TTFT 2), decodes end 2 and 3.
	if !near(res.TTFTs[0], 1) || !near(res.TTFTs[1], 2) || !near(res.Makespan, 3) {
		t.Fatalf("TTFTs %v makespan %v", res.TTFTs, res.Makespan)
	}
}

func TestSimulateSpeedup(t *testing.T) {
	reqs := []Request{
		{Timestamp: 1000, InputLength: 100, HashIDs: []uint64{1}},
		{Timestamp: 5000, InputLength: 100, HashIDs: []uint64{2}},
	}
	cfg := FleetConfig{Pods: 1, Cache: cache.Config{Policy: "lru", Capacity: 10}, BlockSize: 512, Speedup: 4,
		Service: ServiceModel{MaxBatch: 1, PrefillPerToken: 0.001}}
	res, err := simulate(cfg, reqs, &recRouter{})
	if err != nil {
		t.Fatal(err)
	}
	// Second arrival at (5000-1000)/1000/4 = 1 s; its prefill ends at 1.1.
	if !near(res.Makespan, 1.1) {
		t.Fatalf("makespan %v, want 1.1", res.Makespan)
	}
}

func loadView(load ...int) *view { return &view{Load: load, BlockSize: 512} }

func TestLeastLoadedAndRoundRobin(t *testing.T) {
	ll := &leastLoadedRouter{}
	v := loadView(0, 0, 0)
	var got []int
	for i := 0; i < 4; i++ {
		got = append(got, ll.route(nil, v))
	}
	if !reflect.DeepEqual(got, []int{0, 1, 2, 0}) {
		t.Fatalf("idle ties %v, want rotation", got)
	}
	if p := ll.route(nil, loadView(3, 1, 2)); p != 1 {
		t.Fatalf("picked %d, want 1", p)
	}
	rr := &roundRobinRouter{}
	got = got[:0]
	for i := 0; i < 4; i++ {
		got = append(got, rr.route(nil, v))
	}
	if !reflect.DeepEqual(got, []int{0, 1, 2, 0}) {
		t.Fatalf("round robin %v", got)
	}
}

func TestCHWBL(t *testing.T) {
	r := newCHWBLRouter(4, 256, 1, 1.25)
	a := &Request{HashIDs: []uint64{42, 1}}
	b := &Request{HashIDs: []uint64{42, 2}}
	p := r.route(a, loadView(0, 0, 0, 0))
	if q := r.route(b, loadView(0, 0, 0, 0)); q != p {
		t.Fatalf("same head went to %d and %d", p, q)
	}
	// Bounded load: total 4, mean after +1 = 5/4, threshold 1.5625: the home
	// pod at load 4 fails (5 > 1.56), an idle pod passes.
	load := []int{0, 0, 0, 0}
	load[p] = 4
	if q := r.route(a, loadView(load...)); q == p {
		t.Fatalf("overloaded home pod %d still chosen", p)
	}
}

func TestApproxRouterFollowsHistoryWithGuard(t *testing.T) {
	r := newApproxRouter(3, 100, loadGuard{Abs: 2}, 0)
	first := r.route(&Request{InputLength: 1024, HashIDs: []uint64{1, 2}}, loadView(0, 0, 0))
	if p := r.route(&Request{InputLength: 1024, HashIDs: []uint64{1, 3}}, loadView(1, 1, 1)); p != first {
		t.Fatalf("shared prefix went to %d, want %d", p, first)
	}
	load := []int{0, 0, 0}
	load[first] = 3 // min 0 + guard 2 < 3: not eligible
	if p := r.route(&Request{InputLength: 1024, HashIDs: []uint64{1, 4}}, loadView(load...)); p == first {
		t.Fatal("load guard ignored")
	}
}

func TestAIBrixRouter(t *testing.T) {
	r := newAIBrixRouter(16, 2, 1000)
	p0 := r.route(&Request{HashIDs: []uint64{1, 2, 3, 4}}, loadView(0, 0, 0))
	// Balanced fleet (stddev 0): the matching pod is within mean + 2*0 (<=).
	if p := r.route(&Request{HashIDs: []uint64{1, 2, 9, 9}}, loadView(1, 1, 1)); p != p0 {
		t.Fatalf("prefix match went to %d, want %d", p, p0)
	}
	// Imbalance gate: max-min = 17 > 16 -> least loaded, even though p0 matches.
	load := []int{5, 5, 5}
	load[p0] = 0
	load[(p0+1)%3] = 17
	load[(p0+2)%3] = 1
	if p := r.route(&Request{HashIDs: []uint64{1, 2, 3, 4}}, loadView(load...)); p != p0 {
		t.Fatalf("least loaded is %d; got %d", p0, p)
	}
	// mean + 2*stddev guard: loads [10, 0, 0] (mean 3.33, sd 4.71 -> 12.76): 10 passes;
	// loads with a hot matching pod above the bound fall back to least loaded.
	r2 := newAIBrixRouter(100, 0, 1000) // k=0: only pods at or below the mean
	h := r2.route(&Request{HashIDs: []uint64{5}}, loadView(0, 0, 0))
	load = []int{1, 1, 1}
	load[h] = 4 // mean 2 < 4
	if p := r2.route(&Request{HashIDs: []uint64{5}}, loadView(load...)); p == h {
		t.Fatal("mean+k*stddev guard ignored")
	}
}

func TestSGLangRouter(t *testing.T) {
	r := newSGLangRouter(3, 0.3, 64, 1.5, 1000)
	p := r.route(&Request{InputLength: 2048, HashIDs: []uint64{1, 2, 3, 4}}, loadView(0, 0, 0))
	// match 2/4 blocks = 0.5 > 0.3: follow the cache.
	if q := r.route(&Request{InputLength: 2048, HashIDs: []uint64{1, 2, 8, 9}}, loadView(0, 0, 0)); q != p {
		t.Fatalf("match 0.5 went to %d, want %d", q, p)
	}
	// match 1/4 = 0.25 <= 0.3: smallest tree, which is not p (p has 6 blocks).
	if q := r.route(&Request{InputLength: 2048, HashIDs: []uint64{1, 5, 6, 7}}, loadView(0, 0, 0)); q == p {
		t.Fatal("low match still followed the cache")
	}
	// Imbalanced (100-0 > 64 and 100 > 1.5*0): shortest queue.
	load := []int{100, 100, 100}
	load[(p+1)%3] = 0
	if q := r.route(&Request{InputLength: 2048, HashIDs: []uint64{1, 2, 3, 4}}, loadView(load...)); q != (p+1)%3 {
		t.Fatalf("imbalanced: got %d", q)
	}
}

func TestGenWorkloadShape(t *testing.T) {
	reqs, err := GenWorkload(DefaultWorkload())
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1150 {
		t.Fatalf("%d requests, want 230*5", len(reqs))
	}
	// 9000 tokens = 18 blocks; 8000/512 = 15 blocks wholly inside the system prompt.
	a, b, c := reqs[0], reqs[230], reqs[1]
	if len(a.HashIDs) != 18 || a.InputLength != 9000 || a.OutputLength != 1000 {
		t.Fatalf("request shape %d blocks %d in %d out", len(a.HashIDs), a.InputLength, a.OutputLength)
	}
	if !reflect.DeepEqual(a.HashIDs[:15], b.HashIDs[:15]) || a.HashIDs[15] == b.HashIDs[15] {
		t.Fatal("same group must share exactly the 15 system blocks")
	}
	if a.HashIDs[0] == c.HashIDs[0] {
		t.Fatal("different groups share block 0")
	}
	// Ceiling by hand: the first request of each group misses; the other 4 of 5
	// hit 15 blocks = 7680 of 9000 tokens: 0.8 * 7680/9000.
	h, tot := unboundedHitRate(reqs, 512)
	if want := 0.8 * 7680 / 9000; !near(float64(h)/float64(tot), want) {
		t.Fatalf("ceiling %v, want %v", float64(h)/float64(tot), want)
	}
}

// Whole conversation trace, 8 pods: deterministic, and cache-aware routing
// must beat cache-blind routing on hit rate (not a timing test).
func TestSimulateConversationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the real trace")
	}
	reqs := loadTestTrace(t, "conversation_trace")
	cfg := FleetConfig{Pods: 8, Cache: cache.Config{Policy: "lru", Capacity: 1000}, BlockSize: 512, Speedup: 1, EventLag: 0.1,
		Service: DefaultServiceModel()}
	run := func(name string) result {
		r, err := newRouter(name, DefaultRouterParams(8, 512, 1000))
		if err != nil {
			t.Fatal(err)
		}
		res, err := simulate(cfg, reqs, r)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run("random"), run("random")
	a.WallSeconds, b.WallSeconds = 0, 0
	if !reflect.DeepEqual(a, b) {
		t.Fatal("random routing is not deterministic for a seed")
	}
	ceiling := 0.374
	for _, name := range []string{"approx-prefix", "sglang", "aibrix"} {
		r := run(name)
		if r.HitRate <= a.HitRate || r.HitRate > ceiling {
			t.Errorf("%s hit rate %.3f, random %.3f, ceiling %.3f", name, r.HitRate, a.HitRate, ceiling)
		}
	}
}

type badRouter struct{ noEvents }

func (badRouter) name() string              { return "bad" }
func (badRouter) route(*Request, *view) int { return 7 }

func TestSimulateRejectsBadInput(t *testing.T) {
	reqs := []Request{{InputLength: 10, HashIDs: []uint64{1}}}
	ok := FleetConfig{Pods: 2, Cache: cache.Config{Policy: "lru", Capacity: 4}, BlockSize: 512, Service: DefaultServiceModel()}
	if _, err := simulate(ok, reqs, badRouter{}); err == nil || !strings.Contains(err.Error(), "returned pod 7") {
		t.Fatalf("out-of-range pod: err %v", err)
	}
	for _, mut := range []func(*FleetConfig){
		func(c *FleetConfig) { c.Pods = 0 },
		func(c *FleetConfig) { c.Service.MaxBatch = 0 },
		func(c *FleetConfig) { c.BlockSize = 0 },
		func(c *FleetConfig) { c.Cache.Capacity = 0 },
	} {
		c := ok
		mut(&c)
		if _, err := simulate(c, reqs, &roundRobinRouter{}); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	// Requests without blocks or tokens are served, not a crash.
	empty := []Request{{}, {InputLength: 5}}
	for _, name := range RouterOrder {
		r, err := newRouter(name, RouterParams{Pods: 2, BlockSize: 512, ApproxCapacity: 4, CHWBLHead: 1, CHWBLLoad: 1.25,
			CHWBLReplicas: 4, AIBrixImbalance: 16, AIBrixStdFactor: 2, AIBrixBlocks: 10, SGLCacheThresh: 0.3, SGLBalanceAbs: 64,
			SGLBalanceRel: 1.5, SGLTreeBlocks: 10, SpecTTL: 1})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := simulate(ok, empty, r); err != nil || res.HitTokens != 0 {
			t.Errorf("%s on empty requests: %v %+v", name, err, res)
		}
	}
	if _, err := ReadTrace(strings.NewReader(`{"input_length": -1}`)); err == nil {
		t.Error("negative input_length accepted")
	}
}

// The choice approx-prefix and precise share, by hand: guard, ties, MinMatch.
func TestAffinityChoice(t *testing.T) {
	q := &Request{InputLength: 1536, HashIDs: []uint64{1, 2, 3}}
	for _, tc := range []struct {
		matched, load []int
		guard         int
		minMatch      float64
		want          int
	}{
		{[]int{0, 2, 2}, []int{0, 3, 1}, 4, 0, 2},   // tie on 2 blocks: the less loaded
		{[]int{0, 2, 2}, []int{0, 1, 1}, 4, 0, 1},   // full tie: the lower index
		{[]int{0, 1, 2}, []int{0, 1, 3}, 2, 0, 1},   // pod 2 (load 3 > 0+2) is not eligible
		{[]int{0, 1, 2}, []int{0, 1, 3}, -1, 0, 2},  // guard off
		{[]int{0, 2, 0}, []int{0, 0, 1}, 4, 0.6, 1}, // 1024/1536 = 0.67 >= 0.6: follow pod 1
		{[]int{0, 2, 0}, []int{0, 0, 1}, 4, 0.8, 0}, // 0.67 < 0.8: least loaded (pods 0, 1 tie: 0)
		{[]int{0, 0, 0}, []int{2, 1, 0}, 4, 0, 2},   // nothing matches: least loaded
	} {
		next := 0
		if got := affinityChoice(tc.matched, q, loadView(tc.load...), loadGuard{tc.guard}, tc.minMatch, &next); got != tc.want {
			t.Errorf("affinityChoice(%v, load %v, guard %d, min %v) = %d, want %d", tc.matched, tc.load, tc.guard, tc.minMatch, got, tc.want)
		}
	}
}

// TestLeastLoadedZeroHitsIsTheGroupStride pins why least-loaded reuses
// nothing on the generated workload: the generator sends request i to group
// i mod G, and least-loaded on a balanced fleet (ties rotate) places request
// i on pod i mod pods. A group's requests are G apart, so with G mod pods =
// 6 of 8 they visit pods g, g+6, g+4, g+2 and only return to g after 4G
// requests, by which time that pod's LRU has cycled; with G a multiple of the
// pod count every request of a group lands on the same pod and the hit rate
// is the ceiling. The 0.0% is the workload's stride, not a routing bug.
func TestLeastLoadedZeroHitsIsTheGroupStride(t *testing.T) {
	hit := func(groups int) (float64, float64) {
		wl := DefaultWorkload()
		wl.Groups, wl.SystemTokens, wl.UserTokens, wl.BlockSize, wl.Rate = groups, 6000, 1200, 64, 10
		reqs, err := GenWorkload(wl)
		if err != nil {
			t.Fatal(err)
		}
		cfg := FleetConfig{Pods: 8, Cache: cache.Config{Policy: "lru", Capacity: 4802}, BlockSize: 64, Speedup: 1,
			EventLag: 0.1, Service: DefaultServiceModel()}
		res, err := simulate(cfg, reqs, &leastLoadedRouter{})
		if err != nil {
			t.Fatal(err)
		}
		h, tot := unboundedHitRate(reqs, 64)
		return res.HitRate, float64(h) / float64(tot)
	}
	if got, _ := hit(150); got != 0 {
		t.Errorf("150 groups: hit rate %.3f, want 0 (stride 6 of 8 pods)", got)
	}
	if got, ceiling := hit(152); !near(got, ceiling) {
		t.Errorf("152 groups: hit rate %.3f, want the ceiling %.3f (stride 0)", got, ceiling)
	}
}
