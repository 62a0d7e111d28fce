package routing

import (
	"errors"
	"testing"
)

func TestParseRole(t *testing.T) {
	cases := []struct {
		in   string
		want Role
		ok   bool
	}{
		{"", RoleBoth, true},
		{"both", RoleBoth, true},
		{"prefill-decode", RoleBoth, true},
		{"prefill", RolePrefill, true},
		{"decode", RoleDecode, true},
		{"encode", RoleEncode, true},
		{"Prefill", RoleBoth, false}, // exact, as llm-d's by-label filter
		{"decoder", RoleBoth, false},
		{" decode", RoleBoth, false},
	}
	for _, tc := range cases {
		got, ok := ParseRole(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseRole(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	for r := Role(0); r < NumRoles; r++ {
		if back, ok := ParseRole(r.String()); !ok || back != r {
			t.Errorf("role %d: String %q does not parse back", r, r.String())
		}
	}
	if NumRoles.String() != "unknown" || NumSplits.String() != "unknown" {
		t.Error("out-of-range role or split has a name")
	}
}

func TestRoleStages(t *testing.T) {
	cases := []struct {
		r                 Role
		decodes, prefills bool
	}{
		{RoleBoth, true, false},
		{RolePrefill, false, true},
		{RoleDecode, true, false},
		{RoleEncode, false, false},
	}
	for _, tc := range cases {
		if tc.r.Decodes() != tc.decodes || tc.r.Prefills() != tc.prefills {
			t.Errorf("%v: decodes %v prefills %v", tc.r, tc.r.Decodes(), tc.r.Prefills())
		}
	}
}

func TestNonCachedTokens(t *testing.T) {
	cases := []struct {
		req     Request
		matched int
		want    int
	}{
		{Request{Blocks: 10, Tokens: 170, BlockSize: 16}, 0, 170},
		{Request{Blocks: 10, Tokens: 170, BlockSize: 16}, 4, 170 - 64},
		{Request{Blocks: 10, Tokens: 170, BlockSize: 16}, 10, 10},  // the partial tail block
		{Request{Blocks: 10, Tokens: 0, BlockSize: 16}, 3, 7 * 16}, // tokens unknown
		{Request{Blocks: 2, Tokens: 20, BlockSize: 16}, 5, 0},      // never negative
	}
	for _, tc := range cases {
		if got := NonCachedTokens(tc.req, tc.matched); got != tc.want {
			t.Errorf("NonCachedTokens(%+v, %d) = %d, want %d", tc.req, tc.matched, got, tc.want)
		}
	}
}

func TestDecide(t *testing.T) {
	def := DefaultPD()
	if def.MaxLocalPrefillTokens != 1000 || def.MaxPrefillWaiting != 2 {
		t.Fatalf("defaults %+v, want Dynamo's 1000 tokens and queue 2", def)
	}
	cases := []struct {
		p                        PDParams
		nonCached, pods, waiting int
		want                     Split
	}{
		{def, 5000, 0, 0, SplitNoPrefillPool},
		{def, 1000, 2, 0, SplitFewTokens}, // at the threshold: local
		{def, 1001, 2, 0, SplitRemote},    // just above: remote
		{def, 1001, 2, 1, SplitRemote},    // queue 1 < 2
		{def, 1001, 2, 2, SplitPrefillBusy},
		{def, 0, 2, 9, SplitFewTokens}, // the token rule comes first
		{PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: -1}, 1, 1, 1000, SplitRemote},
		{PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: 0}, 1, 1, 0, SplitPrefillBusy},
	}
	for _, tc := range cases {
		if got := tc.p.Decide(tc.nonCached, tc.pods, tc.waiting); got != tc.want {
			t.Errorf("%+v.Decide(%d, %d, %d) = %v, want %v", tc.p, tc.nonCached, tc.pods, tc.waiting, got, tc.want)
		}
	}
	if (PDParams{MaxLocalPrefillTokens: -1}).Validate() == nil || def.Validate() != nil {
		t.Error("Validate")
	}
	seen := map[string]bool{}
	for s := Split(0); s < NumSplits; s++ {
		if seen[s.String()] {
			t.Errorf("split %d repeats name %q", s, s.String())
		}
		seen[s.String()] = true
	}
}

// pdFleet is two prefill pods (0, 1) and two decode pods (2, 3), plus an
// encoder (4), on a request of 100 blocks of 16 tokens.
func pdFleet() ([]Candidate, []Role, Request) {
	c := make([]Candidate, 5)
	roles := []Role{RolePrefill, RolePrefill, RoleDecode, RoleDecode, RoleEncode}
	return c, roles, Request{Blocks: 100, Tokens: 1600, BlockSize: 16}
}

func TestPickPD(t *testing.T) {
	pol := mustNew(t, NameGuardedPrefix)
	sub, at := make([]Candidate, 5), make([]int32, 5)
	cases := []struct {
		name    string
		set     func(c []Candidate)
		decode  int
		prefill int
		split   Split
	}{
		{"conversation cached on a decode pod: it decodes and prefills the rest", func(c []Candidate) {
			c[3].Matched, c[3].Cached = 95, 95 // 1600-1520 = 80 tokens left
			c[0].Matched, c[0].Cached = 100, 100
		}, 3, -1, SplitFewTokens},
		{"long new prompt: the prefill pod holding its prefix prefills", func(c []Candidate) {
			c[1].Matched, c[1].Cached = 40, 40
		}, 2, 1, SplitRemote},
		{"decode pod's cache decides the decode stage, prefill pod's the prefill stage", func(c []Candidate) {
			c[2].Matched, c[2].Cached = 10, 10 // 1440 tokens left: remote
			c[0].Matched, c[0].Cached = 30, 30
			c[1].Matched, c[1].Cached = 20, 20
		}, 2, 0, SplitRemote},
		{"busy prefill pool: decode pod prefills", func(c []Candidate) {
			c[0].Waiting, c[1].Waiting = 1, 1
		}, 2, -1, SplitPrefillBusy},
		{"a loaded decode holder loses to an idle decode pod (the policy's guard)", func(c []Candidate) {
			c[2].Matched, c[2].Cached, c[2].Running = 100, 100, 9
			c[3].Running = 0
		}, 3, 0, SplitRemote},
		{"the encoder is never chosen", func(c []Candidate) {
			c[4].Matched, c[4].Cached = 100, 100
		}, 2, 0, SplitRemote},
	}
	for _, tc := range cases {
		c, roles, req := pdFleet()
		tc.set(c)
		ch, err := PickPD(pol, DefaultPD(), req, c, roles, sub, at)
		if err != nil || ch.Decode != tc.decode || ch.Prefill != tc.prefill || ch.Split != tc.split {
			t.Errorf("%s: got %+v %v, want decode %d prefill %d %v", tc.name, ch, err, tc.decode, tc.prefill, tc.split)
			continue
		}
		if ch.PrefillPods != 2 || ch.NonCached != NonCachedTokens(req, c[tc.decode].Matched) {
			t.Errorf("%s: numbers %+v", tc.name, ch)
		}
		// Scores: guarded-prefix writes Score = Matched for the stages
		// that ran, 0 elsewhere.
		for i := range c {
			ran := roles[i].Decodes() || (roles[i].Prefills() && ch.Prefill >= 0)
			want := 0.0
			if ran {
				want = float64(c[i].Matched)
			}
			if c[i].Score != want {
				t.Errorf("%s: candidate %d score %v, want %v", tc.name, i, c[i].Score, want)
			}
		}
	}
}

func TestPickPDEdges(t *testing.T) {
	pol := mustNew(t, NameSGLang)
	sub, at := make([]Candidate, 4), make([]int32, 4)
	req := Request{Blocks: 100, Tokens: 1600, BlockSize: 16}
	// Only prefill and encode pods: nobody decodes.
	c := []Candidate{{}, {}}
	if _, err := PickPD(pol, DefaultPD(), req, c, []Role{RolePrefill, RoleEncode}, sub, at); !errors.Is(err, ErrNoDecodeCandidate) {
		t.Fatalf("err = %v", err)
	}
	// Short scratch or roles: an error, not a panic.
	if _, err := PickPD(pol, DefaultPD(), req, make([]Candidate, 5), nil, sub, at); err == nil {
		t.Fatal("short scratch accepted")
	}
	if _, err := PickPD(pol, DefaultPD(), req, c, []Role{RoleBoth}, sub, at); err == nil {
		t.Fatal("short roles accepted")
	}
	// Every pod RoleBoth (or roles nil): exactly the policy's own pick.
	for _, n := range Names() {
		p := mustNew(t, n)
		a := []Candidate{cand(3, 0, 0.2, 4), cand(0, 1, 0.5, 9), cand(1, 0, 0.1, 0), cand(2, 2, 0.9, 9)}
		b := append([]Candidate(nil), a...)
		want, why := p.Pick(req, a)
		ch, err := PickPD(p, DefaultPD(), req, b, nil, sub, at)
		if err != nil || ch.Decode != want || ch.DecodeReason != why || ch.Prefill != -1 || ch.Split != SplitNoPrefillPool {
			t.Errorf("%s: PickPD %+v %v, Pick %d %v", n, ch, err, want, why)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Errorf("%s: candidate %d %+v, Pick wrote %+v", n, i, b[i], a[i])
			}
		}
	}
}

func TestKVSource(t *testing.T) {
	cases := []struct {
		name string
		have int
		s    []Source
		want int
	}{
		{"none", 5, nil, -1},
		{"holds the same: never named", 5, []Source{{Matched: 5, Cached: 5}}, -1},
		{"holds less", 5, []Source{{Matched: 3, Cached: 3}}, -1},
		{"holds one more", 5, []Source{{Matched: 6, Cached: 6}}, 0},
		{"most blocks wins", 0, []Source{{Matched: 6, Cached: 6}, {Matched: 9, Cached: 2}, {Matched: 7, Cached: 7}}, 1},
		{"tie: the faster tier", 0, []Source{{Matched: 9, Cached: 4}, {Matched: 9, Cached: 9}}, 1},
		{"tie: the earlier", 0, []Source{{Matched: 9, Cached: 9}, {Matched: 9, Cached: 9}}, 0},
	}
	for _, tc := range cases {
		if got := KVSource(tc.have, tc.s); got != tc.want {
			t.Errorf("%s: KVSource = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPickPDDoesNotAllocate(t *testing.T) {
	c := make([]Candidate, 64)
	roles := make([]Role, 64)
	for i := range c {
		c[i] = cand(i%7, 0, float64(i)/64, i%11)
		roles[i] = Role(i % 3)
	}
	sub, at := make([]Candidate, 64), make([]int32, 64)
	src := []Source{{Matched: 3}, {Matched: 12}}
	req := Request{Blocks: 512, Tokens: 512 * 16, BlockSize: 16}
	pd := PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: -1}
	for _, n := range Names() {
		p := mustNew(t, n)
		if a := testing.AllocsPerRun(100, func() {
			if _, err := PickPD(p, pd, req, c, roles, sub, at); err != nil {
				t.Fatal(err)
			}
			KVSource(4, src)
		}); a != 0 {
			t.Errorf("%s: %v allocations per PickPD", n, a)
		}
	}
}

func BenchmarkPickPD64(b *testing.B) {
	c := make([]Candidate, 64)
	roles := make([]Role, 64)
	for i := range c {
		c[i] = cand(i%7, i%3, float64(i)/64, i%11)
		roles[i] = RolePrefill + Role(i%2)
	}
	sub, at := make([]Candidate, 64), make([]int32, 64)
	req := Request{Blocks: 512, Tokens: 512 * 16, BlockSize: 16}
	p, _ := New(NameSGLang, Defaults())
	pd := PDParams{MaxLocalPrefillTokens: 0, MaxPrefillWaiting: -1}
	for b.Loop() {
		_, _ = PickPD(p, pd, req, c, roles, sub, at)
	}
}
