package indexer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// fakeClock is the injected clock of the speculative and history TTLs.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// registries remembers each test indexer's registry for the metric checks.
var registries sync.Map // *Indexer -> *prometheus.Registry

func newPickIndexer(t testing.TB, clk *fakeClock, pc PickConfig) *Indexer {
	t.Helper()
	pc.Now = clk.Now
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Pick: pc, Registry: reg})
	registries.Store(ix, reg)
	return ix
}

func hashQuery(prompt []uint32, cands ...Candidate) *PickQuery {
	return &PickQuery{Query: Query{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})},
		Candidates: cands}
}

func idle(pod string) Candidate { return Candidate{Pod: pod} }

func mustPick(t *testing.T, ix *Indexer, q *PickQuery, r *PickResult) {
	t.Helper()
	if err := ix.Pick(context.Background(), q, r); err != nil {
		t.Fatalf("Pick: %v", err)
	}
}

func cand(r *PickResult, pod string) *CandidateResult {
	for i := range r.Candidates {
		if r.Candidates[i].Pod == pod {
			return &r.Candidates[i]
		}
	}
	return nil
}

func TestPickEqualLoadLongestPrefixWins(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 16*testBlock)
	apply(ix, "a", 0, storeEvent(prompt, 4, event.TierGPU))
	apply(ix, "b", 0, storeEvent(prompt, 12, event.TierGPU))
	apply(ix, "c", 1, storeEvent(prompt, 8, event.TierGPU))
	for _, pol := range routing.Names() {
		if pol == routing.NameLeastLoaded {
			continue
		}
		q := hashQuery(prompt, Candidate{Pod: "a", Load: routing.Load{Running: 3}}, Candidate{Pod: "b", Load: routing.Load{Running: 3}},
			Candidate{Pod: "c", Load: routing.Load{Running: 3}}, Candidate{Pod: "fresh", Events: EventsOn, Load: routing.Load{Running: 3}})
		q.Policy = pol
		var r PickResult
		mustPick(t, ix, q, &r)
		if r.Pod != "b" || r.Policy != pol || r.Chosen != 1 || r.TotalBlocks != 16 {
			t.Errorf("%s: picked %q (%v), want b", pol, r.Pod, r.Reason)
		}
		if c := cand(&r, "c"); c.MatchedBlocks != 8 || !c.HasDPRank || c.DPRank != 1 || c.Tiers[event.TierGPU] != 8 {
			t.Errorf("%s: candidate c = %+v", pol, c)
		}
	}
}

// A holder of the whole prompt with three requests in flight loses to an
// idle pod under the cost model: 1*(16-16) + 3*16 + 0 = 48 > 1*16 + 0 + 16.
func TestPickLoadedHolderLosesToIdlePod(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 16*testBlock)
	apply(ix, "hot", 0, storeEvent(prompt, 16, event.TierGPU))
	var r PickResult
	q := hashQuery(prompt, Candidate{Pod: "hot", Load: routing.Load{Running: 3}}, Candidate{Pod: "idle", Events: EventsOn})
	q.Policy = routing.NameCost
	mustPick(t, ix, q, &r)
	if r.Pod != "idle" || r.Reason != routing.ReasonLowestCost || r.Candidates[0].Cost != 48 || r.Candidates[1].Cost != 32 {
		t.Fatalf("picked %q %v %+v", r.Pod, r.Reason, r.Candidates)
	}
	// One in flight: 16 < 32, the holder keeps the request.
	q = hashQuery(prompt, Candidate{Pod: "hot", Load: routing.Load{Running: 1}}, Candidate{Pod: "idle2", Events: EventsOn})
	q.Policy = routing.NameCost
	mustPick(t, ix, q, &r)
	if r.Pod != "hot" || r.Candidates[0].Cost != 16 {
		t.Fatalf("lightly loaded holder lost: %q %+v", r.Pod, r.Candidates)
	}
}

func TestPickSpeculativeEntries(t *testing.T) {
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{})
	prompt := seqTokens(100, 10*testBlock)
	cands := func() []Candidate {
		return []Candidate{{Pod: "p0", Events: EventsOn}, {Pod: "p1", Events: EventsOn}, {Pod: "p2", Events: EventsOn}}
	}
	var r PickResult
	mustPick(t, ix, hashQuery(prompt, cands()...), &r)
	first := r.Pod
	if c := cand(&r, first); c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0 {
		t.Fatalf("first pick already matched: %+v", c)
	}
	// The first pick made its pod a little busier, as the router would
	// report it; the speculative prefix still wins under the cost model.
	q := hashQuery(prompt, cands()...)
	q.Candidates[r.Chosen].Running = 1
	mustPick(t, ix, q, &r)
	if r.Pod != first {
		t.Fatalf("second identical pick went to %q, first to %q", r.Pod, first)
	}
	if c := cand(&r, first); c.MatchedBlocks != 10 || c.SpeculativeBlocks != 10 {
		t.Fatalf("second pick: %+v, want 10 speculative blocks", c)
	}
	if got := gaugeValue(t, ix, "kvindexd_pick_assumed_entries", "speculative"); got != 10 {
		t.Errorf("speculative entries = %v, want 10", got)
	}

	// The TTL passes with no event: the entries are gone.
	clk.Advance(2*time.Second + time.Nanosecond)
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: first, Events: EventsOn, Load: routing.Load{Running: 5}}, Candidate{Pod: "other", Events: EventsOn}), &r)
	if c := cand(&r, first); c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0 {
		t.Fatalf("after the TTL: %+v", c)
	}
}

func TestPickRealEventsReplaceSpeculative(t *testing.T) {
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{})
	prompt := seqTokens(100, 10*testBlock)
	var r PickResult
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "p0", Events: EventsOn}), &r)
	if ix.pick.specMem.len() != 10 {
		t.Fatalf("entries = %d", ix.pick.specMem.len())
	}
	// p0 stores 6 of the 10 blocks: those entries are replaced by real ones.
	apply(ix, "p0", 0, storeEvent(prompt, 6, event.TierGPU))
	if n := ix.pick.specMem.len(); n != 4 {
		t.Fatalf("entries after BlockStored = %d, want 4", n)
	}
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "p0"}), &r)
	if c := r.Candidates[0]; c.MatchedBlocks != 10 || c.SpeculativeBlocks != 4 || c.Tiers[event.TierGPU] != 6 {
		t.Fatalf("after 6 real blocks: %+v", c)
	}
	// p0 evicts block 8 (contradiction): its entry goes; the run stops at 8.
	hs := blockHashes(prompt, blockkeys.RequestExtras{})
	apply(ix, "p0", 0, event.Event{Kind: event.BlockRemoved, BlockHashes: hs[8:9]})
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "p0"}), &r)
	if c := r.Candidates[0]; c.MatchedBlocks != 8 || c.SpeculativeBlocks != 2 {
		t.Fatalf("after the removal: %+v", c)
	}
}

func TestPickCandidateWithoutEventsCanWin(t *testing.T) {
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{})
	prompt := seqTokens(5, 12*testBlock)
	other := seqTokens(900, 12*testBlock)
	apply(ix, "evented", 0, storeEvent(other, 12, event.TierGPU)) // knows a different prompt
	var r PickResult
	// "silent" publishes nothing and is unknown to the index: routing history.
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "evented", Load: routing.Load{Running: 1}}, Candidate{Pod: "silent"}), &r)
	if r.Pod != "silent" || !r.Candidates[1].Approximate || r.Candidates[1].MatchedBlocks != 0 {
		t.Fatalf("first pick: %q %+v", r.Pod, r.Candidates)
	}
	clk.Advance(time.Minute)
	// Same prompt, equal load: the history says silent holds it.
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "evented", Load: routing.Load{Running: 1}}, Candidate{Pod: "silent", Load: routing.Load{Running: 1}}), &r)
	if r.Pod != "silent" || r.Candidates[1].MatchedBlocks != 12 || r.Candidates[1].SpeculativeBlocks != 0 {
		t.Fatalf("second pick: %q %+v", r.Pod, r.Candidates)
	}
	// events:false wins over the index even for a pod it knows.
	mustPick(t, ix, hashQuery(other, Candidate{Pod: "evented", Events: EventsOff}), &r)
	if !r.Candidates[0].Approximate || r.Candidates[0].MatchedBlocks != 0 {
		t.Fatalf("events:false: %+v", r.Candidates[0])
	}
	// The history forgets after its TTL (120 s since the last pick).
	clk.Advance(121 * time.Second)
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "silent"}, Candidate{Pod: "x"}), &r)
	if r.Candidates[0].MatchedBlocks != 0 {
		t.Fatalf("history outlived its TTL: %+v", r.Candidates[0])
	}
}

func TestPickValidation(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 8)
	cases := map[string]*PickQuery{
		"candidates is required": hashQuery(prompt),
		"pod is empty":           hashQuery(prompt, Candidate{}),
		"kv_usage is 1.5":        hashQuery(prompt, Candidate{Pod: "a", Load: routing.Load{KVUsage: 1.5}}),
		"waiting and running":    hashQuery(prompt, Candidate{Pod: "a", Load: routing.Load{Waiting: -1}}),
		"dp_rank is -2":          hashQuery(prompt, Candidate{Pod: "a", HasDPRank: true, DPRank: -2}),
		`repeats pod "a"`:        hashQuery(prompt, Candidate{Pod: "a"}, Candidate{Pod: "a"}),
		"unknown policy":         {Query: hashQuery(prompt).Query, Candidates: []Candidate{{Pod: "a"}}, Policy: "best"},
		"pods does not apply":    {Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"a"}}, Candidates: []Candidate{{Pod: "a"}}},
		"block_hashes is empty":  {Query: Query{Model: testModel, Kind: InputHashes}, Candidates: []Candidate{{Pod: "a"}}},
	}
	many := hashQuery(prompt)
	for i := 0; i <= MaxCandidates; i++ {
		many.Candidates = append(many.Candidates, Candidate{Pod: fmt.Sprint(i)})
	}
	cases["limit 4096"] = many
	// (pod) and (pod, rank) name the same engine once the index knows it.
	apply(ix, "r", 1, storeEvent(prompt, 1, event.TierGPU))
	cases[`repeats pod "r" dp_rank 1`] = hashQuery(prompt, Candidate{Pod: "r"}, Candidate{Pod: "r", HasDPRank: true, DPRank: 1})
	for want, q := range cases {
		var r PickResult
		err := ix.Pick(context.Background(), q, &r)
		e, ok := err.(*Error)
		if !ok || e.Code != InvalidArgument || !strings.Contains(e.Msg, want) {
			t.Errorf("%s: got %v", want, err)
		}
		if len(r.Candidates) != 0 || r.Pod != "" {
			t.Errorf("%s: result not empty after an error", want)
		}
	}
	// The candidate table is left clean after a rejected query.
	var r PickResult
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "r"}), &r)
	if r.Candidates[0].MatchedBlocks != 1 || r.DPRank != 1 || !r.HasDPRank {
		t.Fatalf("after errors: %+v", r)
	}
}

// visitOnly hides the memory index's fused scorer so lookups go through
// Lookup, which flakyIndex fails while down.
type visitOnly struct{ *flakyIndex }

func (v visitOnly) backend() BackendFunc {
	return func(context.Context, *kvindex.Interner) (Backend, error) {
		return Backend{Index: v.flakyIndex, Health: v.flakyIndex}, nil
	}
}

// The index being down is reported as Unavailable, as by Score.
func TestPickIndexDown(t *testing.T) {
	f := &flakyIndex{MemoryIndex: kvindex.NewMemoryIndex(kvindex.MemoryConfig{})}
	ix := newTestIndexer(t, Config{Backend: visitOnly{f}.backend()})
	prompt := seqTokens(1, 8)
	apply(ix, "a", 0, storeEvent(prompt, 2, event.TierGPU))
	f.down.Store(true)
	var r PickResult
	for _, q := range []*PickQuery{
		hashQuery(prompt, Candidate{Pod: "a"}),                     // index lookup fails
		hashQuery(prompt, Candidate{Pod: "new", Events: EventsOn}), // no lookup: health check
	} {
		err := ix.Pick(context.Background(), q, &r)
		if e, ok := err.(*Error); !ok || e.Code != Unavailable {
			t.Errorf("%+v: got %v", q.Candidates, err)
		}
	}
	// Pods without events alone need no index.
	mustPick(t, ix, hashQuery(prompt, Candidate{Pod: "silent", Events: EventsOff}), &r)
}

func TestPickMetrics(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 8)
	var r PickResult
	mustPick(t, ix, hashQuery(prompt, idle("a"), idle("b")), &r)
	q := hashQuery(prompt, idle("a"))
	q.Policy = routing.NameAIBrix
	mustPick(t, ix, q, &r)
	if got := counterValue(t, ix, "kvindexd_picks_total", map[string]string{"policy": "sglang", "reason": "no-prefix-match"}); got != 1 {
		t.Errorf("default-policy picks = %v", got)
	}
	if got := counterValue(t, ix, "kvindexd_picks_total", map[string]string{"policy": "aibrix", "reason": "only-candidate"}); got != 1 {
		t.Errorf("aibrix picks = %v", got)
	}
}

func TestPickConfigErrors(t *testing.T) {
	bad := []PickConfig{
		{DefaultPolicy: "nope"},
		{Params: &routing.Params{Cost: routing.CostParams{OverlapWeight: -1}}},
		{SpeculativeCapacity: -1},
		{HistoryCapacity: maxHoldCapacity + 1},
		{FeedbackCapacity: -1},
		{FeedbackCapacity: int(Options.FeedbackCapacity.Max) + 1},
		{FeedbackTTL: -time.Second},
	}
	for _, pc := range bad {
		if _, err := New(context.Background(), Config{Keys: testKeys, Pick: pc}); err == nil {
			t.Errorf("%+v accepted", pc)
		}
	}
	// TTLs below zero turn the stores off.
	ix := newTestIndexer(t, Config{Pick: PickConfig{SpeculativeTTL: -1, HistoryTTL: -1, DefaultPolicy: routing.NameSGLang}})
	if ix.pick.spec != nil || ix.pick.hist != nil || ix.pick.order[ix.pick.def].Name() != routing.NameSGLang {
		t.Fatal("stores on or wrong default")
	}
	var r PickResult
	mustPick(t, ix, hashQuery(seqTokens(1, 8), idle("a")), &r)
	mustPick(t, ix, hashQuery(seqTokens(1, 8), idle("a")), &r)
	if r.Candidates[0].MatchedBlocks != 0 || r.Policy != routing.NameSGLang {
		t.Fatalf("%+v", r)
	}
}

// A warm Pick into a reused result allocates nothing, speculative entries
// and routing history included.
func TestPickReusedResultDoesNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	clk := newFakeClock()
	ix := newPickIndexer(t, clk, PickConfig{})
	prompt := seqTokens(7, 64*testBlock)
	var cands []Candidate
	for p := 0; p < 8; p++ {
		apply(ix, fmt.Sprintf("pod-%d", p), p%2, storeEvent(prompt, 60-p*8, event.TierGPU))
		cands = append(cands, Candidate{Pod: fmt.Sprintf("pod-%d", p), Load: routing.Load{Running: p}})
	}
	cands = append(cands, Candidate{Pod: "silent", Events: EventsOff, Load: routing.Load{Running: 3}})
	q := hashQuery(prompt, cands...)
	var r PickResult
	mustPick(t, ix, q, &r)
	mustPick(t, ix, q, &r)
	for _, pol := range routing.Names() {
		q.Policy = pol
		if a := testing.AllocsPerRun(50, func() { mustPick(t, ix, q, &r) }); a != 0 {
			t.Errorf("%s: Pick allocates %.1f times per call", pol, a)
		}
	}
	// A P/D pick too: half the pods prefill, the pair is chosen and a
	// kv_source looked for among every holder.
	for i := range q.Candidates {
		q.Candidates[i].Role = routing.RolePrefill + routing.Role(i%2)
	}
	q.Policy = ""
	mustPick(t, ix, q, &r)
	if !r.PD {
		t.Fatalf("not a P/D pick: %+v", r)
	}
	if a := testing.AllocsPerRun(50, func() { mustPick(t, ix, q, &r) }); a != 0 {
		t.Errorf("P/D: Pick allocates %.1f times per call", a)
	}
}

func counterValue(t *testing.T, ix *Indexer, name string, labels map[string]string) float64 {
	t.Helper()
	return metricValue(t, ix, name, labels)
}

func gaugeValue(t *testing.T, ix *Indexer, name, store string) float64 {
	t.Helper()
	return metricValue(t, ix, name, map[string]string{"store": store})
}

func metricValue(t *testing.T, ix *Indexer, name string, labels map[string]string) float64 {
	t.Helper()
	reg, _ := registries.Load(ix)
	mfs, err := reg.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return value(m)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}
