package sim

import (
	"github.com/kvindex/kvindex/indexer/routing"
)

// The daemon's pick policies (package routing, the code /v1/pick runs) as
// scenario schedulers: "policy: pick:<name>" in a scenario file. The
// endpoints' scraped load and the precise index's matched blocks are the
// policy's inputs; every matched block counts at GPU weight (the simulated
// engines have one tier). Speculative entries and the routing history live
// in the daemon's indexer and are exercised by the trace simulator's
// pick:<name> routers (pickrouter.go).
func init() {
	for _, name := range routing.Names() {
		registerPickPolicy("pick:"+name, func(uint64) pickFunc {
			pol, err := routing.New(name, routing.Defaults())
			if err != nil {
				panic(err) // the documented defaults are valid
			}
			var cands []routing.Candidate
			return func(req *pickRequest, eps []endpoint) int {
				cands = cands[:0]
				for _, e := range eps {
					cands = append(cands, routing.Candidate{Load: routing.Load{Waiting: e.Waiting, Running: e.Running, KVUsage: e.KVUsage},
						Matched: e.MatchedBlocks, Cached: float64(e.MatchedBlocks)})
				}
				bs := 0
				if req.TotalBlocks > 0 {
					bs = req.PromptTokens / req.TotalBlocks
				}
				i, _ := pol.Pick(routing.Request{Blocks: req.TotalBlocks, Tokens: req.PromptTokens, BlockSize: bs}, cands)
				return i
			}
		})
	}
}
