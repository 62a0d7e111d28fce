package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// smallScenarioFile is a fleet small enough for unit tests that still fills
// its KV caches: 3 pods x 40 blocks of 16 tokens, 12 groups sharing a
// 96-token system prompt, six schedulers (four built-in, two custom).
const smallScenarioFile = "testdata/scenarios/small.yaml"

func readSmall(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(smallScenarioFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parseSmall(t *testing.T, extra string) *Scenario {
	t.Helper()
	sc, err := parseScenario(strings.NewReader(readSmall(t) + extra))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestScenarioConservationAndKVBound(t *testing.T) {
	sc := parseSmall(t, "")
	// The trace simulator's policies run through the same engines.
	sc.Schedulers = append(sc.Schedulers, schedulerSpec{Name: "ll", Router: "least-loaded"},
		schedulerSpec{Name: "legacy-precise", Router: "precise"}, schedulerSpec{Name: "sglang", Router: "sglang"})
	if err := sc.validate(); err != nil {
		t.Fatal(err)
	}
	wl := sc.generateWorkload()
	hits := map[string]float64{}
	if len(wl.Requests) < 150 {
		t.Fatalf("only %d requests generated", len(wl.Requests))
	}
	for _, spec := range sc.Schedulers {
		run, err := newScenarioRun(sc, wl, spec)
		if err != nil {
			t.Fatal(err)
		}
		maxUsed := 0
		run.OnStep = func(pod int, e *engine) {
			checkPool(t, e)
			maxUsed = max(maxUsed, e.usedBlocks())
		}
		res, err := run.run()
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, err)
		}
		var gen int64
		perPod := 0
		for i, rec := range run.records {
			if !rec.done || rec.generated != wl.Requests[i].OutputLen || rec.firstToken < wl.Requests[i].Arrival ||
				rec.finish < rec.firstToken {
				t.Fatalf("%s: request %d: %+v", spec.Name, i, rec)
			}
			gen += int64(rec.generated)
		}
		var engGen int64
		finished := 0
		for _, e := range run.engines {
			st := e.statsNow()
			engGen += st.GeneratedToken
			finished += st.FinishedSeqs
			if e.usedBlocks() != 0 || e.numRunning() != 0 || e.numWaiting() != 0 {
				t.Errorf("%s: an engine is not drained", spec.Name)
			}
		}
		for _, n := range res.PerPodRequests {
			perPod += n
		}
		if engGen != gen || finished != len(wl.Requests) || perPod != len(wl.Requests) {
			t.Errorf("%s: engines generated %d tokens (requests %d), finished %d, routed %d of %d requests",
				spec.Name, engGen, gen, finished, perPod, len(wl.Requests))
		}
		if maxUsed > sc.engineConfig().KVBlocks || res.MaxKVUsage > 1 {
			t.Errorf("%s: %d blocks used of %d", spec.Name, maxUsed, sc.engineConfig().KVBlocks)
		}
		hits[spec.Name] = res.HitRate
		if res.MaxKVUsage < 0.9 {
			t.Errorf("%s: KV peaked at %.0f%%: the scenario no longer exercises a full cache", spec.Name, 100*res.MaxKVUsage)
		}
	}
	// The legacy precise router follows the pods' events it now receives.
	if !(hits["legacy-precise"] > hits["ll"]+0.15) {
		t.Errorf("legacy precise hit rate %.2f vs least-loaded %.2f", hits["legacy-precise"], hits["ll"])
	}
}

func TestScenarioDeterministic(t *testing.T) {
	run := func(sc *Scenario) []byte {
		rep, err := RunScenario(sc)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Results {
			r.WallSeconds = 0
		}
		b, _ := json.Marshal(rep)
		return b
	}
	a, b := run(parseSmall(t, "")), run(parseSmall(t, ""))
	if !bytes.Equal(a, b) {
		t.Error("two runs of the same scenario differ")
	}
	other := parseSmall(t, "")
	other.Seed = 8
	if bytes.Equal(a, run(other)) {
		t.Error("another seed gave the same results: the seed is not used")
	}
}

func TestScenarioPrecisePrefixBeatsRandomOnSmallFleet(t *testing.T) {
	rep, err := RunScenario(parseSmall(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]*schedulerResult{}
	for _, r := range rep.Results {
		by[r.Scheduler] = r
	}
	if !(by["precise"].HitRate > by["random"].HitRate+0.2) || !(by["precise"].TTFTMean < by["random"].TTFTMean) {
		t.Errorf("precise hit %.2f TTFT %.3f vs random hit %.2f TTFT %.3f", by["precise"].HitRate, by["precise"].TTFTMean,
			by["random"].HitRate, by["random"].TTFTMean)
	}
	if len(by["precise"].Stages) != 3 || by["precise"].Stages[0].Rate != 5 {
		t.Errorf("stages %+v", by["precise"].Stages)
	}
}

func TestPreciseIndexPodMapping(t *testing.T) {
	x, err := newPreciseIndex(4, 16)
	if err != nil {
		t.Fatal(err)
	}
	x.apply(2, []kvOp{{Blocks: []uint64{11, 12, 13}}}, 0)
	x.apply(0, []kvOp{{Blocks: []uint64{11}}}, 0)
	eps := make([]endpoint, 4)
	x.match([]uint64{11, 12, 13, 14}, eps)
	want := []int{1, 0, 3, 0}
	for p := range eps {
		if eps[p].MatchedBlocks != want[p] {
			t.Errorf("pod %d matched %d, want %d", p, eps[p].MatchedBlocks, want[p])
		}
	}
	x.apply(2, []kvOp{{Removed: true, Blocks: []uint64{12}}}, 1)
	x.match([]uint64{11, 12, 13}, eps)
	if eps[2].MatchedBlocks != 1 {
		t.Errorf("after removing block 12, pod 2 matched %d, want 1", eps[2].MatchedBlocks)
	}
}

func TestScorersNormalise(t *testing.T) {
	eps := []endpoint{{Pod: 0, Waiting: 4, KVUsage: 0.25, MatchedBlocks: 0}, {Pod: 1, Waiting: 0, KVUsage: 1, MatchedBlocks: 3},
		{Pod: 2, Waiting: 2, KVUsage: 0, MatchedBlocks: 5}}
	out := make([]float64, 3)
	req := &pickRequest{TotalBlocks: 10}
	check := func(name string, want []float64) {
		t.Helper()
		for i := range want {
			if math.Abs(out[i]-want[i]) > 1e-12 {
				t.Errorf("%s: scores %v, want %v", name, out, want)
				return
			}
		}
	}
	queueScorer{}.score(req, eps, out)
	check("queue", []float64{0, 1, 0.5})
	kvUsageScorer{}.score(req, eps, out)
	check("kv", []float64{0.75, 0, 1})
	(&precisePrefixScorer{}).score(req, eps, out)
	check("precise minmax", []float64{0, 0, 1})
	(&precisePrefixScorer{absolute: true}).score(req, eps, out)
	check("precise absolute", []float64{0, 0.3, 0.5})
	eps[1].MatchedBlocks, eps[2].MatchedBlocks = 5, 5
	(&precisePrefixScorer{}).score(req, eps, out)
	check("precise minmax equal", []float64{0, 1, 1})
	for i := range eps {
		eps[i].Waiting = 3
	}
	queueScorer{}.score(req, eps, out)
	check("queue equal", []float64{1, 1, 1})
}

func TestApproxPrefixScorerGIEWalk(t *testing.T) {
	// Block size 4, prompts of 16 tokens (4 blocks) after the model's hash;
	// two groups with a 12-token system prompt: the first 3 blocks are the
	// group's.
	a := newApproxPrefixScorer(3, 4, 256, 100)
	p0 := &prompt{ID: 0, Group: 0, Question: 0, SystemLen: 12, Len: 16}
	p1 := &prompt{ID: 1, Group: 0, Question: 1, SystemLen: 12, Len: 16}
	p2 := &prompt{ID: 2, Group: 1, Question: 0, SystemLen: 12, Len: 16}
	eps := []endpoint{{Pod: 0}, {Pod: 1}, {Pod: 2}}
	out := make([]float64, 3)
	a.record(&pickRequest{Prompt: p0}, 1)
	a.score(&pickRequest{Prompt: p1}, eps, out)
	if out[0] != 0 || out[1] != 0.8 || out[2] != 0 {
		t.Errorf("same group, other question: %v, want [0 0.8 0] (model hash and 3 of 4 blocks)", out)
	}
	a.score(&pickRequest{Prompt: p0}, eps, out)
	if out[1] != 1 {
		t.Errorf("same prompt: %v, want pod 1 at 1", out)
	}
	// Another group: only the model's hash, which every server picked
	// before holds.
	a.score(&pickRequest{Prompt: p2}, eps, out)
	if out[0] != 0 || out[1] != 0.2 || out[2] != 0 {
		t.Errorf("other group: %v, want [0 0.2 0]", out)
	}
	short := &prompt{ID: 3, Group: 2, SystemLen: 2, Len: 3}
	if h := a.blocks(short); h != nil {
		t.Errorf("prompt shorter than a block: %d hashes, want none", len(h))
	}
	// The walk stops at the first hash no server holds, even if later
	// hashes are held: pod 1 holds hashes 0, 1 and 3 of p1, not 2; a server
	// that lacks an earlier hash still counts the later ones it holds
	// (pod 2 holds only hash 1).
	g := newApproxPrefixScorer(3, 4, 256, 100)
	hs := g.blocks(p1)
	for _, k := range []int{0, 1, 3} {
		g.holders[hs[k]] = 1 << 1
	}
	g.holders[hs[1]] |= 1 << 2
	g.score(&pickRequest{Prompt: p1}, eps, out)
	if out[1] != 0.4 || out[2] != 0.2 {
		t.Errorf("walk past a gap: pods 1, 2 scored %v, %v, want 0.4 (2 of 5 hashes), 0.2", out[1], out[2])
	}
	// Truncation: at most maxBlocks blocks after the model's hash.
	if n := len(newApproxPrefixScorer(3, 4, 2, 100).blocks(p0)); n != 3 {
		t.Errorf("max 2 blocks: %d hashes, want 3", n)
	}
	// LRU bound: a 5-entry LRU per server forgets p0's blocks after p2's
	// (the model's hash, refreshed, stays).
	b := newApproxPrefixScorer(3, 4, 256, 5)
	b.record(&pickRequest{Prompt: p0}, 0)
	b.record(&pickRequest{Prompt: p2}, 0)
	b.score(&pickRequest{Prompt: p0}, eps, out)
	if out[0] != 0.2 || len(b.holders) != 5 {
		t.Errorf("after eviction: %v with %d indexed hashes, want 0.2 (the model hash) and 5", out, len(b.holders))
	}
}

func TestMaxScorePickerTiesAreSeededRandom(t *testing.T) {
	spec, err := schedulerSpec{Name: "q", Scorers: []scorerSpec{{Type: "queue", Weight: 1}}}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	eps := []endpoint{{Pod: 0}, {Pod: 1}, {Pod: 2}, {Pod: 3, Waiting: 1}}
	pick := func(seed uint64) []int {
		s, err := newScheduler(spec, 4, 16, 100, seed)
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for i := 0; i < 60; i++ {
			out = append(out, s.pick(&pickRequest{}, eps))
		}
		return out
	}
	a, b := pick(1), pick(1)
	seen := map[int]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed, different picks")
		}
		seen[a[i]] = true
	}
	if len(seen) != 3 || seen[3] {
		t.Errorf("picked %v: want all three tied pods and never the one with a queue", seen)
	}
}

func TestExternalPickPolicyRunsThroughTheSimulator(t *testing.T) {
	name := "test-fewest-in-flight-then-prefix"
	sawMatch := false
	registerPickPolicy(name, func(uint64) pickFunc {
		return func(req *pickRequest, eps []endpoint) int {
			best := 0
			for i, e := range eps {
				if e.MatchedBlocks > 0 {
					sawMatch = true
				}
				if e.MatchedBlocks > eps[best].MatchedBlocks ||
					(e.MatchedBlocks == eps[best].MatchedBlocks && e.InFlight < eps[best].InFlight) {
					best = i
				}
			}
			return best
		}
	})
	defer delete(pickPolicies, name)
	sc := parseSmall(t, "")
	sc.Schedulers = []schedulerSpec{{Name: name}, {Name: "named", Policy: name}}
	if err := sc.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := RunScenario(sc)
	if err != nil {
		t.Fatal(err)
	}
	if !sawMatch || rep.Results[0].HitRate < 0.3 {
		t.Errorf("external policy: saw matched blocks %v, hit rate %.2f", sawMatch, rep.Results[0].HitRate)
	}
}

func TestParseScenarioRejectsBadInput(t *testing.T) {
	mods := map[string]func(string) string{
		"unknown key":       func(s string) string { return s + "bogus: 1\n" },
		"unknown scheduler": func(s string) string { return strings.Replace(s, "  - random\n", "  - nonesuch\n", 1) },
		"bad load type":     func(s string) string { return strings.Replace(s, "type: poisson", "type: burst", 1) },
		"warmup too long":   func(s string) string { return strings.Replace(s, "warmup_stages: 1", "warmup_stages: 3", 1) },
		"request too big":   func(s string) string { return strings.Replace(s, "output_len: 24", "output_len: 600", 1) },
		"bad scorer": func(s string) string {
			return strings.Replace(s, "type: queue, weight: 1", "type: latency, weight: 1", 1)
		},
		"duplicate name": func(s string) string { return strings.Replace(s, "  - load\n", "  - random\n", 1) },
		"router and scorers": func(s string) string {
			return strings.Replace(s, "  - name: prefix-only\n", "  - name: prefix-only\n    router: random\n", 1)
		},
		"fleet too big": func(s string) string {
			return strings.Replace(s, "kv_tokens_per_pod: 640", "kv_tokens_per_pod: 6400000000", 1)
		},
		"NaN rate":                 func(s string) string { return strings.Replace(s, "rate: 10,", "rate: .nan,", 1) },
		"unknown router":           func(s string) string { return s + "  - {name: x, router: nonesuch}\n" },
		"bad client type":          func(s string) string { return s + "client: {type: closed}\n" },
		"negative concurrency":     func(s string) string { return s + "client: {max_concurrency: -1}\n" },
		"timeout below overhead":   func(s string) string { return s + "client: {timeout_s: 0.1, request_overhead_s: 0.2}\n" },
		"negative overhead":        func(s string) string { return s + "client: {request_overhead_s: -1}\n" },
		"negative overhead spread": func(s string) string { return s + "client: {request_overhead_exp_s: -0.1}\n" },
		"infinite overhead spread": func(s string) string { return s + "client: {request_overhead_exp_s: .inf}\n" },
		"negative gateway limit":   func(s string) string { return s + "client: {gateway_max_active: -1}\n" },
		"read share above 1": func(s string) string {
			return strings.Replace(s, "engine:\n", "engine:\n  shared_kv_read_once: true\n  shared_kv_read_share: 1.5\n", 1)
		},
		"read share without read once": func(s string) string {
			return strings.Replace(s, "engine:\n", "engine:\n  shared_kv_read_share: 0.5\n", 1)
		},
		"random picker with scorers": func(s string) string {
			return strings.Replace(s, "  - name: prefix-only\n", "  - name: prefix-only\n    picker: random\n", 1)
		},
	}
	small := readSmall(t)
	for name, mod := range mods {
		if _, err := parseScenario(strings.NewReader(mod(small))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, bad := range []string{"", "pods: [", strings.Repeat("#", 2<<20)} {
		if _, err := parseScenario(strings.NewReader(bad)); err == nil {
			t.Errorf("%.20q accepted", bad)
		}
	}
}

func TestCommitted73CapacityScenarioParses(t *testing.T) {
	sc, err := ReadScenarioFile("testdata/scenarios/llm-d-73-capacity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wl := sc.generateWorkload()
	if sc.engineConfig().KVBlocks != 4802 || len(sc.Load.Stages) != 17 || len(wl.Prompts) != 750 {
		t.Errorf("blocks %d stages %d prompts %d", sc.engineConfig().KVBlocks, len(sc.Load.Stages), len(wl.Prompts))
	}
	// Expected request count: sum of rate x duration = 17,258.
	if n := len(wl.Requests); n < 16500 || n > 18000 {
		t.Errorf("%d requests", n)
	}
}

func TestScenarioScale(t *testing.T) {
	sc, err := ReadScenarioFile("testdata/scenarios/llm-d-37-capacity.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := *sc
	for _, k := range ScaleKeys {
		if err := sc.Scale(k, 2); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	e, b := sc.Engine, base.Engine
	if e.PrefillTokensPerS != 2*b.PrefillTokensPerS || e.DecodeITL != 2*b.DecodeITL || e.DecodePerSeq != 2*b.DecodePerSeq ||
		e.DecodePerKVToken != 2*b.DecodePerKVToken || sc.KVTokensPerPod != 2*base.KVTokensPerPod || sc.MetricsPeriod != 2*base.MetricsPeriod {
		t.Errorf("scaled x2: %+v kv %d metrics %v; base %+v kv %d metrics %v", e, sc.KVTokensPerPod, sc.MetricsPeriod, b, base.KVTokensPerPod, base.MetricsPeriod)
	}
	// A share is at most 1 (every holder reads the block).
	if e.SharedKVReadShare != 1 {
		t.Errorf("shared_kv_read_share 0.5 x2 = %v, want 1", e.SharedKVReadShare)
	}
	if sc.Scale("nope", 2) == nil || sc.Scale("decode_itl_s", 0) == nil || sc.Scale("decode_itl_s", math.Inf(1)) == nil {
		t.Error("bad key or factor accepted")
	}
	// A result the scenario cannot hold is refused: one request no longer fits a pod.
	if sc.Scale("kv_tokens_per_pod", 1e-3) == nil {
		t.Error("a pod smaller than one request accepted")
	}
}

// fakeScheduler records what a replica was asked to do.
type fakeScheduler struct {
	choice int
	picks  int
	routes []int
	events int
}

func (f *fakeScheduler) pick(*pickRequest, []endpoint) int { f.picks++; return f.choice }
func (f *fakeScheduler) routed(_ *pickRequest, pod int)    { f.routes = append(f.routes, pod) }
func (*fakeScheduler) needsIndex() bool                    { return false }
func (*fakeScheduler) wantsEvents() bool                   { return true }
func (f *fakeScheduler) onKVEvents(int, []kvOp, float64)   { f.events++ }

func TestReplicatedSchedulerTakesTurnsAndSharesEvents(t *testing.T) {
	a, b := &fakeScheduler{choice: 0}, &fakeScheduler{choice: 1}
	r := &replicatedScheduler{reps: []scheduler{a, b}}
	eps := []endpoint{{Pod: 0}, {Pod: 1}}
	var got []int
	for i := 0; i < 5; i++ {
		k := r.pick(&pickRequest{}, eps)
		r.routed(&pickRequest{}, k)
		got = append(got, k)
	}
	// Request n goes to replica n mod 2, and only the replica that picked
	// is told the outcome (GIE's PostCycle runs in the picker that ran the
	// cycle).
	if want := []int{0, 1, 0, 1, 0}; !slices.Equal(got, want) || a.picks != 3 || b.picks != 2 ||
		!slices.Equal(a.routes, []int{0, 0, 0}) || !slices.Equal(b.routes, []int{1, 1}) {
		t.Errorf("picks %v (a %d, routes %v; b %d, routes %v)", got, a.picks, a.routes, b.picks, b.routes)
	}
	// KV events reach every replica.
	r.onKVEvents(0, nil, 0)
	if a.events != 1 || b.events != 1 || !r.wantsEvents() {
		t.Errorf("events: a %d b %d", a.events, b.events)
	}
}

func TestReplicatedApproxIndexesLearnOnlyTheirOwnPicks(t *testing.T) {
	spec, err := schedulerSpec{Name: "a", Scorers: []scorerSpec{{Type: "approx-prefix", Weight: 2}, {Type: "queue", Weight: 1}}}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	one, err := newReplicatedScheduler(spec, 4, 16, 100, 1, 9)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := one.(*profile); !ok {
		t.Fatalf("one replica is %T, want the plain profile", one)
	}
	s, err := newReplicatedScheduler(spec, 4, 16, 100, 2, 9)
	if err != nil {
		t.Fatal(err)
	}
	r := s.(*replicatedScheduler)
	p := &prompt{ID: 0, Group: 0, SystemLen: 64, Len: 80}
	eps := []endpoint{{Pod: 0}, {Pod: 1}, {Pod: 2}, {Pod: 3}}
	var pods []int
	for i := 0; i < 6; i++ {
		req := &pickRequest{Prompt: p}
		k := r.pick(req, eps)
		r.routed(req, k)
		pods = append(pods, k)
	}
	// Each replica pins the prompt to its own first pick; the other
	// replica's index never hears of it. (With these seeds the two first
	// picks differ, so the indexes can be told apart.)
	if pods[0] == pods[1] {
		t.Fatalf("picks %v: both replicas chose pod %d first; pick seeds that differ", pods, pods[0])
	}
	for i := 2; i < len(pods); i++ {
		if pods[i] != pods[i%2] {
			t.Errorf("picks %v: replica %d left its first pod", pods, i%2)
		}
	}
	for k, rep := range r.reps {
		a := rep.(*profile).scorers[0].(*approxPrefixScorer)
		for _, h := range a.blocks(p) {
			if a.holders[h] != 1<<pods[k] {
				t.Errorf("replica %d indexes pods %b for a block, want only its own pick %d", k, a.holders[h], pods[k])
			}
		}
	}
}

func TestScenarioRouterReplicas(t *testing.T) {
	sc := parseSmall(t, "")
	if sc.RouterReplicas != 1 {
		t.Errorf("default router_replicas %d, want 1", sc.RouterReplicas)
	}
	for _, bad := range []int{0, -1, MaxRouterReplicas + 1} {
		if sc.SetRouterReplicas(bad) == nil {
			t.Errorf("router_replicas %d accepted", bad)
		}
	}
	if _, err := parseScenario(strings.NewReader(readSmall(t) + "router_replicas: 0\n")); err == nil {
		t.Error("router_replicas: 0 in a file accepted")
	}
	// approx-small pins every group to one pod with one picker; three
	// pickers, each with its own index, copy groups to more pods.
	ppg := func(n int) float64 {
		sc := parseSmall(t, fmt.Sprintf("router_replicas: %d\n", n))
		sc.Schedulers = []schedulerSpec{sc.Schedulers[len(sc.Schedulers)-1]}
		rep, err := RunScenario(sc)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Results[0].PodsPerGroup
	}
	if one, three := ppg(1), ppg(3); one != 1 || !(three > 1) {
		t.Errorf("approx-small pods per group: %.2f with one picker (want 1), %.2f with three (want more)", one, three)
	}
}
