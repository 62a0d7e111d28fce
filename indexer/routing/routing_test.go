package routing

import (
	"math"
	"testing"
)

func cand(running, waiting int, kv float64, matched int) Candidate {
	return Candidate{Load: Load{Running: running, Waiting: waiting, KVUsage: kv}, Matched: matched, Cached: float64(matched)}
}

func mustNew(t *testing.T, name string) Policy {
	t.Helper()
	p, err := New(name, Defaults())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewRejectsBadParams(t *testing.T) {
	bad := []struct {
		name string
		mod  func(*Params)
	}{
		{NameCost, func(p *Params) { p.Cost.OverlapWeight = -1 }},
		{NameCost, func(p *Params) { p.Cost.BlocksPerRequest = math.NaN() }},
		{NameWeighted, func(p *Params) { p.Weighted.Queue = math.Inf(1) }},
		{NameAIBrix, func(p *Params) { p.AIBrix.ImbalanceAbs = -1 }},
		{NameSGLang, func(p *Params) { p.SGLang.BalanceRel = -0.5 }},
		{NameGuardedPrefix, func(p *Params) { p.GuardedPrefix.MinMatch = 2 }},
	}
	for _, b := range bad {
		p := Defaults()
		b.mod(&p)
		if _, err := New(b.name, p); err == nil {
			t.Errorf("%s: bad params accepted", b.name)
		}
	}
	if _, err := New("nope", Defaults()); err == nil {
		t.Error("unknown policy accepted")
	}
	for _, n := range Names() {
		p := mustNew(t, n)
		if p.Name() != n {
			t.Errorf("New(%q).Name() = %q", n, p.Name())
		}
	}
}

// TestEqualLoadLongestPrefixWins: with every pod equally loaded, every
// cache-aware policy sends the request to the longest cached prefix.
func TestEqualLoadLongestPrefixWins(t *testing.T) {
	req := Request{Blocks: 10, Tokens: 10 * 16, BlockSize: 16}
	for _, n := range []string{NameCost, NameWeighted, NameAIBrix, NameSGLang, NameGuardedPrefix} {
		c := []Candidate{cand(2, 0, 0.3, 3), cand(2, 0, 0.3, 8), cand(2, 0, 0.3, 0), cand(2, 0, 0.3, 5)}
		got, why := mustNew(t, n).Pick(req, c)
		if got != 1 {
			t.Errorf("%s: picked %d (%v), want 1: %+v", n, got, why, c)
		}
	}
}

func TestCostFormula(t *testing.T) {
	p := mustNew(t, NameCost)
	req := Request{Blocks: 10, BlockSize: 16}
	// a: 8 cached, 2 in flight: 1*(10-8) + 2*10 + (10-8) = 24
	// b: nothing cached, idle:  1*10 + 0 + 10 = 20
	c := []Candidate{cand(2, 0, 0, 8), cand(0, 0, 0, 0)}
	got, why := p.Pick(req, c)
	if got != 1 || why != ReasonLowestCost || c[0].Cost != 24 || c[1].Cost != 20 || c[0].Score != 8 {
		t.Fatalf("got %d %v %+v", got, why, c)
	}
	// With 4 blocks per in-flight request a costs 2 + 8 + 2 = 12 and wins.
	p2, _ := New(NameCost, Params{Cost: CostParams{OverlapWeight: 1, BlocksPerRequest: 4}})
	if got, _ := p2.Pick(req, c); got != 0 || c[0].Cost != 12 {
		t.Fatalf("got %d %+v", got, c)
	}
	// Tier credits: 8 matched blocks worth only 4 (on CPU) leave 6 to
	// prefill: 6 + 0 + 2.
	c = []Candidate{{Matched: 8, Cached: 4}, {Load: Load{Running: 0}}}
	p.Pick(req, c)
	if c[0].Cost != 8 {
		t.Fatalf("tier-credited cost = %v, want 8", c[0].Cost)
	}
	// Equal cost: the less loaded wins (a: 0+10+0 = 10, b: 5+0+5 = 10).
	c = []Candidate{cand(1, 0, 0, 10), cand(0, 0, 0, 5)}
	if got, _ := p.Pick(req, c); got != 1 {
		t.Fatalf("tie: picked %d %+v", got, c)
	}
}

func TestWeightedNormalisations(t *testing.T) {
	p := mustNew(t, NameWeighted)
	// prefix: holders 4 and 8 -> 0 and 1, non-holder 0; queue: waiting 0, 4,
	// 2 -> 1, 0, 0.5; kv: 1 - usage.
	c := []Candidate{cand(0, 0, 0.5, 4), cand(0, 4, 0.1, 8), cand(0, 2, 0, 0)}
	got, why := p.Pick(Request{Blocks: 8}, c)
	want := []float64{3*0 + 2*1 + 2*0.5, 3*1 + 2*0 + 2*0.9, 3*0 + 2*0.5 + 2*1}
	for i := range c {
		if math.Abs(c[i].Score-want[i]) > 1e-12 {
			t.Errorf("score[%d] = %v, want %v", i, c[i].Score, want[i])
		}
	}
	if got != 1 || why != ReasonHighestScore {
		t.Fatalf("picked %d %v", got, why)
	}
	// A single holder gets the full prefix score; equal queues all get 1.
	c = []Candidate{cand(0, 1, 0, 2), cand(0, 1, 0, 0)}
	p.Pick(Request{Blocks: 8}, c)
	if c[0].Score != 7 || c[1].Score != 4 {
		t.Fatalf("scores %v %v, want 7 4", c[0].Score, c[1].Score)
	}
}

// TestLoadedHolderLoses: each policy's documented threshold sends the
// request away from a busy holder of the whole prefix to an idle pod.
func TestLoadedHolderLoses(t *testing.T) {
	req := Request{Blocks: 10, Tokens: 160, BlockSize: 16}
	cases := []struct {
		name      string
		holder    Load // holder of all 10 blocks
		want      int
		why       Reason
		justUnder Load // the same holder just under the threshold keeps the request
	}{
		// cost: 0 + L*10 + 0 against 10 + 0 + 10: the holder loses once
		// L > 2 (at 2 the tie goes to the idle pod), keeps it at 1
		{NameCost, Load{Running: 3}, 1, ReasonLowestCost, Load{Running: 1}},
		// aibrix: running spread 17 > 16
		{NameAIBrix, Load{Running: 17}, 1, ReasonImbalanced, Load{Running: 16}},
		// sglang: spread 65 > 64 and 65 > 1.5*0
		{NameSGLang, Load{Running: 65}, 1, ReasonImbalanced, Load{Running: 64}},
		// guarded-prefix: 5 > 0 + 4
		{NameGuardedPrefix, Load{Running: 5}, 1, ReasonOverloaded, Load{Running: 4}},
		// weighted: 3*1 + 2*0 + 2*0.05 = 3.1 < 0 + 2*1 + 2*1 = 4
		{NameWeighted, Load{Waiting: 5, KVUsage: 0.95}, 1, ReasonHighestScore, Load{Waiting: 5, KVUsage: 0.4}},
	}
	for _, tc := range cases {
		p := mustNew(t, tc.name)
		c := []Candidate{{Load: tc.holder, Matched: 10, Cached: 10}, {}}
		if got, why := p.Pick(req, c); got != tc.want || why != tc.why {
			t.Errorf("%s: busy holder: picked %d (%v), want %d (%v)", tc.name, got, why, tc.want, tc.why)
		}
		c = []Candidate{{Load: tc.justUnder, Matched: 10, Cached: 10}, {}}
		if got, why := p.Pick(req, c); got != 0 {
			t.Errorf("%s: holder under the threshold: picked %d (%v), want 0", tc.name, got, why)
		}
	}
}

func TestAIBrixStdDevGuard(t *testing.T) {
	p := mustNew(t, NameAIBrix)
	// running 10, 0, 0, 0, 0: mean 2, sd 4, limit 10: the holder (10) is
	// eligible; with factor 1 (limit 6) it is not.
	c := []Candidate{cand(10, 0, 0, 5), cand(0, 0, 0, 0), cand(0, 0, 0, 0), cand(0, 0, 0, 0), cand(0, 0, 0, 0)}
	if got, why := p.Pick(Request{Blocks: 5}, c); got != 0 || why != ReasonPrefix || c[0].Score != 100 {
		t.Fatalf("picked %d %v score %v", got, why, c[0].Score)
	}
	p1, _ := New(NameAIBrix, Params{AIBrix: AIBrixParams{ImbalanceAbs: 16, StdDevFactor: 1}})
	if got, why := p1.Pick(Request{Blocks: 5}, c); got != 1 || why != ReasonOverloaded {
		t.Fatalf("picked %d %v", got, why)
	}
	// Equal percent: fewer running wins.
	c = []Candidate{cand(3, 0, 0, 5), cand(1, 0, 0, 5), cand(2, 0, 0, 0)}
	if got, _ := p.Pick(Request{Blocks: 5}, c); got != 1 {
		t.Fatalf("picked %d", got)
	}
	// Nobody matched: least running.
	c = []Candidate{cand(3, 0, 0, 0), cand(1, 9, 0, 0)}
	if got, why := p.Pick(Request{Blocks: 5}, c); got != 1 || why != ReasonNoMatch {
		t.Fatalf("picked %d %v", got, why)
	}
}

func TestSGLangCacheThreshold(t *testing.T) {
	p := mustNew(t, NameSGLang)
	req := Request{Blocks: 10, Tokens: 160, BlockSize: 16}
	// 3 of 10 blocks = 0.3, not > 0.3: the pod with the most free cache wins.
	c := []Candidate{cand(0, 0, 0.9, 3), cand(0, 0, 0.2, 0), cand(0, 0, 0.5, 0)}
	if got, why := p.Pick(req, c); got != 1 || why != ReasonNoMatch {
		t.Fatalf("picked %d %v", got, why)
	}
	c[0].Matched = 4
	if got, why := p.Pick(req, c); got != 0 || why != ReasonPrefix || c[0].Score != 0.4 {
		t.Fatalf("picked %d %v score %v", got, why, c[0].Score)
	}
	// Relative threshold: spread 65 > 64 but 210 <= 1.5*145, so the fleet
	// is not imbalanced and the cache decides.
	c = []Candidate{cand(210, 0, 0, 10), cand(145, 0, 0, 0)}
	if got, why := p.Pick(req, c); got != 0 || why != ReasonPrefix {
		t.Fatalf("picked %d %v", got, why)
	}
}

func TestSingleCandidateAndTies(t *testing.T) {
	for _, n := range Names() {
		p := mustNew(t, n)
		c := []Candidate{cand(99, 99, 1, 0)}
		if got, why := p.Pick(Request{Blocks: 4, BlockSize: 16}, c); got != 0 || why != ReasonOnly {
			t.Errorf("%s: single candidate: %d %v", n, got, why)
		}
		// All equal: the earliest candidate, deterministically.
		c = []Candidate{cand(1, 1, 0.5, 0), cand(1, 1, 0.5, 0), cand(1, 1, 0.5, 0)}
		if got, _ := p.Pick(Request{Blocks: 4, BlockSize: 16}, c); got != 0 {
			t.Errorf("%s: all equal: picked %d", n, got)
		}
		// Nothing cached anywhere: the least loaded pod wins.
		c = []Candidate{cand(3, 1, 0.5, 0), cand(1, 0, 0.5, 0), cand(2, 0, 0.5, 0)}
		if got, _ := p.Pick(Request{Blocks: 4, BlockSize: 16}, c); got != 1 {
			t.Errorf("%s: no cache: picked %d, want the least loaded", n, got)
		}
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	c := make([]Candidate, 64)
	for i := range c {
		c[i] = cand(i%7, i%3, float64(i)/64, i%11)
	}
	req := Request{Blocks: 16, Tokens: 256, BlockSize: 16}
	for _, n := range Names() {
		p := mustNew(t, n)
		if a := testing.AllocsPerRun(100, func() { p.Pick(req, c) }); a != 0 {
			t.Errorf("%s: %v allocations per pick", n, a)
		}
	}
}

func TestReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := Reason(0); r < NumReasons; r++ {
		s := r.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("reason %d has name %q", r, s)
		}
		seen[s] = true
	}
	if NumReasons.String() != "unknown" {
		t.Error("out-of-range reason has a name")
	}
}

func BenchmarkPick64(b *testing.B) {
	c := make([]Candidate, 64)
	for i := range c {
		c[i] = cand(i%7, i%3, float64(i)/64, i%11)
	}
	req := Request{Blocks: 512, Tokens: 512 * 16, BlockSize: 16}
	for _, n := range Names() {
		p, _ := New(n, Defaults())
		b.Run(n, func(b *testing.B) {
			for b.Loop() {
				p.Pick(req, c)
			}
		})
	}
}
