package sim

import (
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/sim/cache"
)

// pdTestConfig is a small fleet with round numbers.
func pdTestConfig(prefill, decode int) PDConfig {
	return PDConfig{PrefillPods: prefill, DecodePods: decode, Cache: cache.Config{Policy: "lru", Capacity: 100},
		Service:        ServiceModel{MaxBatch: 8, PrefillBase: 0.01, PrefillPerToken: 1e-4, DecodePerToken: 0.02},
		DecodeCapacity: 8, TransferPerBlock: 0.005, PD: routing.DefaultPD(), BlockSize: 512, Speedup: 1, EventLag: 0.1}
}

func nearEq(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestGenMultiTurnHistoryGrows(t *testing.T) {
	c := DefaultMultiTurn()
	c.Conversations = 30
	reqs, err := GenMultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := GenMultiTurn(c)
	if !reflect.DeepEqual(reqs, again) {
		t.Fatal("same seed, different workload")
	}
	turns := 0
	for i, q := range reqs {
		if i > 0 && q.Timestamp < reqs[i-1].Timestamp {
			t.Fatalf("request %d out of arrival order", i)
		}
		if want := (q.InputLength + c.BlockSize - 1) / c.BlockSize; len(q.HashIDs) != want {
			t.Fatalf("request %d: %d ids for %d tokens, want %d", i, len(q.HashIDs), q.InputLength, want)
		}
		if q.prev == 0 {
			continue
		}
		turns++
		p := reqs[q.prev-1]
		if q.prev-1 >= i || q.InputLength <= p.InputLength+p.OutputLength || q.Timestamp <= p.Timestamp {
			t.Fatalf("request %d: previous turn %d does not come before it with a shorter history", i, q.prev-1)
		}
		// The history: the previous prompt's full blocks, then the blocks
		// its answer completed.
		hist := append(slices.Clone(p.HashIDs[:p.InputLength/c.BlockSize]), p.OutputHashIDs...)
		if !slices.Equal(q.HashIDs[:len(hist)], hist) {
			t.Fatalf("request %d does not start with its previous turn's history", i)
		}
		if len(q.HashIDs) > len(hist) && slices.Contains(p.HashIDs, q.HashIDs[len(hist)]) {
			t.Fatalf("request %d: the block after the history is the previous turn's", i)
		}
	}
	if turns < len(reqs)/2 {
		t.Fatalf("only %d of %d requests are follow-up turns", turns, len(reqs))
	}
	// Every conversation starts with the shared system prompt's blocks.
	for i := range reqs {
		if reqs[i].HashIDs[0] != 0 || reqs[i].HashIDs[1] != 1 {
			t.Fatalf("request %d does not start with the shared system prompt", i)
		}
	}
}

// One disaggregated request: prefill on the prefill pod, every block
// transferred, one decode step, the answer.
func TestPDDisaggregatedTiming(t *testing.T) {
	reqs := []Request{{InputLength: 1024, OutputLength: 3, HashIDs: []uint64{7, 8}}}
	res, err := SimulatePD(pdTestConfig(1, 1), reqs, PDLoad)
	if err != nil {
		t.Fatal(err)
	}
	prefill := 0.01 + 1024*1e-4
	xfer := prefill + 2*0.005
	if !nearEq(res.TTFTs[0], xfer+0.02) || !nearEq(res.Makespan, xfer+3*0.02) {
		t.Fatalf("ttft %v makespan %v, want %v and %v", res.TTFTs[0], res.Makespan, xfer+0.02, xfer+3*0.02)
	}
	if res.Disaggregated != 1 || res.Transferred != 2 || res.ComputedTokens != 1024 {
		t.Fatalf("disaggregated %d transferred %d computed %d", res.Disaggregated, res.Transferred, res.ComputedTokens)
	}
}

// A prefill on a pod that decodes stops its decodes for its duration (the
// decode clock), and a pod prefills one request at a time.
func TestPDDecodeStallsWhileItsPodPrefills(t *testing.T) {
	cfg := pdTestConfig(1, 1)
	cfg.PD = routing.PDParams{MaxLocalPrefillTokens: 1 << 30, MaxPrefillWaiting: -1} // everything stays on the decode pod
	reqs := []Request{
		{Timestamp: 0, InputLength: 512, OutputLength: 10, HashIDs: []uint64{1}},
		{Timestamp: 100, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{2, 3}},
	}
	res, err := SimulatePD(cfg, reqs, PDConditional)
	if err != nil {
		t.Fatal(err)
	}
	a := 0.01 + 512*1e-4    // A's prefill
	b := 0.01 + 1024*1e-4   // B's, from t = 0.1
	aEnd := a + 10*0.02 + b // A's decode stood still during B's prefill
	if res.Disaggregated != 0 || !nearEq(res.TTFTs[0], a) || !nearEq(res.TTFTs[1], b) || !nearEq(res.Makespan, aEnd) {
		t.Fatalf("disaggregated %d ttfts %v makespan %v, want [%v %v] %v", res.Disaggregated, res.TTFTs, res.Makespan, a, b, aEnd)
	}
	if want := (aEnd - a) / 9; !nearEq(res.ITLMean, want) {
		t.Fatalf("itl %v, want %v (A's only: B has one token)", res.ITLMean, want)
	}
}

// The second turn of a conversation returns to the decode pod that holds
// its history; only the blocks that pod lacks are transferred.
func TestPDSecondTurnUsesTheDecodePodsCache(t *testing.T) {
	c := DefaultMultiTurn()
	c.Conversations, c.TurnsMin, c.TurnsMax = 1, 2, 2
	reqs, err := GenMultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	t1, t2 := reqs[0], reqs[1]
	held := map[uint64]bool{}
	for _, h := range append(slices.Clone(t1.HashIDs), t1.OutputHashIDs...) {
		held[h] = true
	}
	k := 0
	for k < len(t2.HashIDs) && held[t2.HashIDs[k]] {
		k++
	}
	if k <= len(t1.HashIDs)/2 {
		t.Fatalf("generator: turn 2 shares only %d blocks", k)
	}
	cfg := pdTestConfig(2, 2)
	res, err := SimulatePD(cfg, reqs, PDPrecise)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(t1.HashIDs) + len(t2.HashIDs) - k); res.Transferred != want {
		t.Fatalf("transferred %d blocks, want %d (turn 2's decode pod held %d)", res.Transferred, want, k)
	}
	if res.Disaggregated != 2 {
		t.Fatalf("pd-precise disaggregated %d of 2", res.Disaggregated)
	}
	// The conditional router keeps turn 2 on the decode pod: fewer than
	// 1,000 tokens are left to prefill.
	if left := t2.InputLength - k*c.BlockSize; left > 1000 {
		t.Skipf("generator left %d tokens", left)
	}
	res, err = SimulatePD(cfg, reqs, PDConditional)
	if err != nil {
		t.Fatal(err)
	}
	if res.Disaggregated != 1 || res.Transferred != int64(len(t1.HashIDs)) {
		t.Fatalf("pd-conditional: disaggregated %d transferred %d, want 1 and %d", res.Disaggregated, res.Transferred, len(t1.HashIDs))
	}
}

// The done criterion, on a small seeded multi-turn run: precise
// pairing is ahead of load-only pairing on TTFT p90 (docs/simulator.md has
// the full table and why).
func TestPDPrecisePairingBeatsLoadOnlyMultiTurn(t *testing.T) {
	c := DefaultMultiTurn()
	c.Conversations, c.Rate = 300, 3
	reqs, err := GenMultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultPDConfig()
	load, err := SimulatePD(cfg, reqs, PDLoad)
	if err != nil {
		t.Fatal(err)
	}
	precise, err := SimulatePD(cfg, reqs, PDPrecise)
	if err != nil {
		t.Fatal(err)
	}
	if !(precise.TTFTp90 < load.TTFTp90) {
		t.Fatalf("TTFT p90: precise pairing %.3f s, load-only %.3f s", precise.TTFTp90, load.TTFTp90)
	}
	// Why: the pairs it picks hold the history, so less is computed and
	// less is transferred.
	if !(precise.ComputedTokens < load.ComputedTokens && precise.Transferred < load.Transferred) {
		t.Fatalf("computed %d vs %d tokens, transferred %d vs %d blocks", precise.ComputedTokens, load.ComputedTokens,
			precise.Transferred, load.Transferred)
	}
	again, _ := SimulatePD(cfg, reqs, PDPrecise)
	if !slices.Equal(again.TTFTs, precise.TTFTs) {
		t.Fatal("same input, different result")
	}
}

func TestPDConfigErrors(t *testing.T) {
	for name, mod := range map[string]func(*PDConfig){
		"no prefill pod": func(c *PDConfig) { c.PrefillPods = 0 },
		"no decode pod":  func(c *PDConfig) { c.DecodePods = 0 },
		"capacity":       func(c *PDConfig) { c.DecodeCapacity = 0 },
		"transfer":       func(c *PDConfig) { c.TransferPerBlock = math.NaN() },
		"threshold":      func(c *PDConfig) { c.PD.MaxLocalPrefillTokens = -1 },
	} {
		cfg := pdTestConfig(1, 1)
		mod(&cfg)
		if _, err := SimulatePD(cfg, nil, PDPrecise); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := SimulatePD(pdTestConfig(1, 1), nil, "nope"); err == nil {
		t.Error("unknown router: no error")
	}
	big := []Request{{InputLength: 512 * 200, OutputLength: 1, HashIDs: make([]uint64, 200)}}
	if _, err := SimulatePD(pdTestConfig(1, 1), big, PDLoad); err == nil {
		t.Error("request larger than a pod's cache: no error")
	}
}

// scriptedPD routes request i as routes[i] says.
type scriptedPD struct {
	routes []pdRoute
	next   int
}

func (*scriptedPD) name() string     { return "scripted" }
func (*scriptedPD) needsIndex() bool { return false }
func (s *scriptedPD) route(*Request, *pdState) pdRoute {
	s.next++
	return s.routes[s.next-1]
}

// A kv_source saves the prefill what it actually holds beyond the pod that
// prefills, at the transfer cost per block, and nothing when it holds no
// more.
func TestPDPullFromKVSource(t *testing.T) {
	cfg := pdTestConfig(1, 2) // pod 0 prefills, pods 1 and 2 decode
	x := []uint64{1, 2, 3, 4}
	reqs := []Request{
		{Timestamp: 0, InputLength: 2048, OutputLength: 1, HashIDs: x},
		{Timestamp: 10_000, InputLength: 3072, OutputLength: 1, HashIDs: append(slices.Clone(x), 5, 6)},
		{Timestamp: 20_000, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 9}},
	}
	r := &scriptedPD{routes: []pdRoute{
		{Decode: 1, Prefill: 0, Source: -1}, // pods 0 and 1 end up holding x
		{Decode: 2, Prefill: -1, Source: 1}, // pod 2 pulls x from pod 1, computes 2 blocks
		{Decode: 2, Prefill: -1, Source: 1}, // pod 2 already holds block 1; pod 1 holds no more
	}}
	res, err := simulatePD(cfg, reqs, r)
	if err != nil {
		t.Fatal(err)
	}
	pullThenPrefill := 4*0.005 + 0.01 + 1024*1e-4
	local := 0.01 + 512*1e-4
	if res.Pulled != 4 || !nearEq(res.TTFTs[1], pullThenPrefill) || !nearEq(res.TTFTs[2], local) {
		t.Fatalf("pulled %d, ttfts %v, want 4 and [_ %v %v]", res.Pulled, res.TTFTs, pullThenPrefill, local)
	}
	if want := int64(2048 + 1024 + 512); res.ComputedTokens != want {
		t.Fatalf("computed %d tokens, want %d", res.ComputedTokens, want)
	}
}
