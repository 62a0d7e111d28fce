package sim

import (
	"testing"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/sim/cache"
)

// The pick routers run the daemon's Pick: a burst of identical requests
// before any event lands on one pod through speculative entries, and
// events then make the index answer.
func TestPickRouterSpeculativeBurst(t *testing.T) {
	r, err := newPickRouter(4, 16, 64, routing.NameCost, 2)
	if err != nil {
		t.Fatal(err)
	}
	q := &Request{InputLength: 64, HashIDs: []uint64{10, 11, 12, 13}}
	v := &view{Load: make([]int, 4), BlockSize: 16}
	first := r.route(q, v)
	v.Load[first]++
	v.Now = 0.01
	if got := r.route(q, v); got != first {
		t.Fatalf("second identical request went to %d, first to %d", got, first)
	}
	if c := r.res.Candidates[first]; c.SpeculativeBlocks != 4 {
		t.Fatalf("no speculative blocks: %+v", c)
	}
	// The pod's events arrive: the match is indexed, no longer speculative.
	r.onKVEvents(first, []kvOp{{Blocks: q.HashIDs}}, 0.1)
	v.Now = 0.2
	r.route(q, v)
	if c := r.res.Candidates[first]; c.MatchedBlocks != 4 || c.SpeculativeBlocks != 0 {
		t.Fatalf("after events: %+v", c)
	}
	// Without speculation the burst scatters by load.
	r2, err := newPickRouter(4, 16, 64, routing.NameCost, 0)
	if err != nil {
		t.Fatal(err)
	}
	v = &view{Load: make([]int, 4), BlockSize: 16}
	a := r2.route(q, v)
	v.Load[a]++
	if b := r2.route(q, v); b == a {
		t.Fatalf("without speculation the second request still went to %d", b)
	}
}

// Every registered pick policy runs a small fleet end to end.
func TestPickRoutersSimulate(t *testing.T) {
	reqs := []Request{{Timestamp: 0, InputLength: 1024, OutputLength: 4, HashIDs: []uint64{1, 2}},
		{Timestamp: 1, InputLength: 1024, OutputLength: 4, HashIDs: []uint64{1, 2}},
		{Timestamp: 2, InputLength: 1536, OutputLength: 4, HashIDs: []uint64{1, 2, 3}}}
	fc := FleetConfig{Pods: 3, Cache: cache.Config{Policy: "lru", Capacity: 100}, Service: DefaultServiceModel(), BlockSize: 512, Speedup: 1, EventLag: 0.1}
	for _, name := range routing.Names() {
		r, err := newRouter("pick:"+name, DefaultRouterParams(3, 512, 100))
		if err != nil {
			t.Fatal(err)
		}
		res, err := simulate(fc, reqs, r)
		if err != nil || res.Requests != 3 {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
		if name != routing.NameLeastLoaded && res.HitTokens == 0 {
			t.Errorf("%s: no cache hit on repeated prompts", name)
		}
	}
}
