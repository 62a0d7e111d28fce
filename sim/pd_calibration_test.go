//go:build !race

package sim

import "testing"

// The claims docs/simulator.md's P/D section makes about its multi-turn
// table (1,500 conversations at 3/s, the default P/D fleet), checked on the
// full run. It takes a few seconds, so it is left out of -short and of race
// builds, as the scenario calibrations are.
func TestPDMultiTurnAsDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("full multi-turn P/D run")
	}
	c := DefaultMultiTurn()
	c.Conversations, c.Rate = 1500, 3
	reqs, err := GenMultiTurn(c)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunPD("multi-turn", reqs, DefaultPDConfig(), PDRouterOrder)
	if err != nil {
		t.Fatal(err)
	}
	r := map[string]PDResult{}
	for _, x := range rep.Results {
		r[x.Router] = x
	}
	agg, load, precise, cond := r[PDAggregated], r[PDLoad], r[PDPrecise], r[PDConditional]
	// Precise pairing ahead of load-only pairing, because its decode pods
	// hold the history: fewer blocks move.
	if !(precise.TTFTp90 < load.TTFTp90 && precise.TTFTp50 < load.TTFTp50) {
		t.Errorf("TTFT p50/p90: precise %.3f/%.3f, load-only %.3f/%.3f", precise.TTFTp50, precise.TTFTp90, load.TTFTp50, load.TTFTp90)
	}
	if !(precise.DecodeLocalHit > 2*load.DecodeLocalHit && 2*precise.Transferred < load.Transferred) {
		t.Errorf("decode pod held %.2f vs %.2f, transferred %d vs %d", precise.DecodeLocalHit, load.DecodeLocalHit,
			precise.Transferred, load.Transferred)
	}
	// Aggregated: the best TTFT and the worst ITL of the four but the
	// conditional router's.
	for _, x := range []PDResult{load, precise, cond} {
		if !(agg.TTFTp90 < x.TTFTp90) {
			t.Errorf("aggregated TTFT p90 %.3f not below %s's %.3f", agg.TTFTp90, x.Router, x.TTFTp90)
		}
	}
	if !(agg.ITLMean > precise.ITLMean && agg.ITLMean > load.ITLMean) {
		t.Errorf("ITL: aggregated %.4f, precise %.4f, load-only %.4f", agg.ITLMean, precise.ITLMean, load.ITLMean)
	}
	// Conditional: the lowest p50 of the P/D routers, a p90 behind always
	// disaggregating (local prefills queue on the decode pods and stall
	// their decodes), most turns kept local.
	if !(cond.TTFTp50 < precise.TTFTp50 && cond.TTFTp90 > precise.TTFTp90 && cond.ITLMean > precise.ITLMean) {
		t.Errorf("conditional p50/p90/ITL %.3f/%.3f/%.4f vs precise %.3f/%.3f/%.4f", cond.TTFTp50, cond.TTFTp90, cond.ITLMean,
			precise.TTFTp50, precise.TTFTp90, precise.ITLMean)
	}
	if share(cond.Disaggregated, cond.Requests) > 0.5 {
		t.Errorf("conditional disaggregated %d of %d", cond.Disaggregated, cond.Requests)
	}
	for _, x := range rep.Results {
		if x.EarlyTurns != 0 {
			t.Errorf("%s: %d turns arrived before their previous answer ended", x.Router, x.EarlyTurns)
		}
	}
}
