package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/sim/cache"
)

func newPrecise(t *testing.T, spec bool) *preciseRouter {
	t.Helper()
	r, err := newPreciseRouter(3, 512, loadGuard{Abs: 4}, 0, spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The precise router sees only what the real applier put in the real index.
func TestPreciseFollowsAppliedEvents(t *testing.T) {
	r := newPrecise(t, false)
	q := &Request{InputLength: 1536, HashIDs: []uint64{1, 2, 3}}
	r.onKVEvents(2, []kvOp{{Blocks: []uint64{1, 2}}}, 0)
	if p := r.route(q, loadView(0, 0, 0)); p != 2 {
		t.Fatalf("routed to %d, want 2 (holds [1,2])", p)
	}
	// Load guard: pod 2 at 5 > min 0 + 4 is not eligible -> least loaded.
	if p := r.route(q, loadView(0, 1, 5)); p != 0 {
		t.Fatalf("guarded: routed to %d, want 0", p)
	}
	// Block 1 removed: the prefix is gone from pod 2 (block 2 alone is no prefix).
	r.onKVEvents(2, []kvOp{{Removed: true, Blocks: []uint64{1}}}, 1)
	if p := r.route(q, loadView(1, 0, 0)); p != 1 {
		t.Fatalf("after removal routed to %d, want least loaded 1", p)
	}
	var found bool
	for _, ps := range r.indexer().Pods(context.Background(), nil) {
		if st := ps.Stats; st.Pod == "pod-2" {
			found = true
			if st.BlocksStored != 2 || st.BlocksRemoved != 1 || st.ParityUnverified != 2 || st.Untrusted {
				t.Fatalf("applier stats %+v", st)
			}
		}
	}
	if !found {
		t.Fatal("applier has no pod-2")
	}
}

// Speculative entries cover the event lag, are replaced by real events and
// expire after the TTL.
func TestPreciseSpeculative(t *testing.T) {
	plain, spec := newPrecise(t, false), newPrecise(t, true)
	a := &Request{InputLength: 1024, HashIDs: []uint64{1, 2}}
	b := &Request{InputLength: 1536, HashIDs: []uint64{1, 2, 5}}
	v := loadView(0, 0, 0)
	if p := spec.route(a, v); p != 0 {
		t.Fatalf("first request to %d", p)
	}
	plain.route(a, v)
	v.Now = 0.5 // no events yet
	if p := spec.route(b, v); p != 0 {
		t.Fatalf("speculative: routed to %d, want 0", p)
	}
	if p := plain.route(b, v); p == 0 {
		t.Fatal("plain precise cannot know pod 0 before its events")
	}
	if n := spec.specEntries(); n != 3 {
		t.Fatalf("%d speculative entries, want 3 (pod 0: 1, 2, 5)", n)
	}
	spec.onKVEvents(0, []kvOp{{Blocks: []uint64{1, 2}}}, 0.6)
	if n := spec.specEntries(); n != 1 {
		t.Fatalf("%d speculative entries after real events, want 1", n)
	}
	// Block 5 never gets a real event: its entry expires at 0.5 + 2.
	v.Now = 2.6
	spec.route(&Request{InputLength: 512, HashIDs: []uint64{9}}, v) // sweeps; adds (pod, 9)
	if n := spec.specEntries(); n != 1 {
		t.Fatalf("%d speculative entries after TTL, want 1 (the new one)", n)
	}
}

// A burst sharing a new prefix inside the event lag, worked by hand.
// 4 pods, guard 4, lag 5 s (no event arrives during the burst), requests
// every 100 ms with blocks [1,2,3,10+i] (2048 tokens), prefill 0.1 ms/token
// (0.2 s uncached), decode 10 s (loads stay up during the burst).
//
//	precise: the index is empty, every request goes least-loaded in rotation:
//	  r0..r3 -> pods 0..3 (misses), r4..r7 -> pods 0..3 again, each hitting
//	  [1,2,3] = 1536 tokens: 4 * 1536 = 6144.
//	precise+spec: r0 -> pod 0 and its blocks become speculative for pod 0;
//	  r1..r4 follow them to pod 0 (loads 1..4 <= min 0 + 4) and hit;
//	  r5 finds pod 0 at load 5 (ineligible) -> least loaded pod 1, a miss;
//	  r6, r7 follow r5's speculative entries to pod 1 and hit: 6 * 1536 = 9216.
func TestSimulateSpeculativeCoversEventLag(t *testing.T) {
	var reqs []Request
	for i := 0; i < 8; i++ {
		reqs = append(reqs, Request{Timestamp: int64(100 * i), InputLength: 2048, OutputLength: 1000, HashIDs: []uint64{1, 2, 3, 10 + uint64(i)}})
	}
	cfg := FleetConfig{Pods: 4, Cache: cache.Config{Policy: "lru", Capacity: 100}, BlockSize: 512, Speedup: 1, EventLag: 5,
		Service: ServiceModel{MaxBatch: 8, PrefillPerToken: 0.0001, DecodePerToken: 0.01}}
	for _, tc := range []struct {
		spec bool
		hit  int64
	}{{false, 6144}, {true, 9216}} {
		r, err := newPreciseRouter(4, 512, loadGuard{Abs: 4}, 0, tc.spec, 2)
		if err != nil {
			t.Fatal(err)
		}
		res, err := simulate(cfg, reqs, r)
		if err != nil {
			t.Fatal(err)
		}
		if res.HitTokens != tc.hit {
			t.Errorf("%s: %d hit tokens, want %d (per pod %v)", r.name(), res.HitTokens, tc.hit, res.PerPod)
		}
		// Every speculative entry was answered by a real event by the end.
		if tc.spec && r.specEntries() != 0 {
			t.Errorf("speculative entries left after real events: %d", r.specEntries())
		}
	}
}

// End to end through the real applier and index: once every event has been
// delivered, the index holds exactly what each simulated pod caches.
func TestPreciseIndexMirrorsPodsAfterRun(t *testing.T) {
	reqs := loadTestTrace(t, "synthetic_trace")[:1500]
	cfg := FleetConfig{Pods: 4, Cache: cache.Config{Policy: "s3fifo", Capacity: 300}, BlockSize: 512, Speedup: 1, EventLag: 0.5,
		Service: DefaultServiceModel()}
	r, err := newPreciseRouter(4, 512, loadGuard{Abs: 4}, 0, true, 2)
	if err != nil {
		t.Fatal(err)
	}
	res, err := simulate(cfg, reqs, r)
	if err != nil {
		t.Fatal(err)
	}
	pods := r.indexer().Pods(context.Background(), nil)
	if len(pods) != 4 {
		t.Fatalf("indexer lists %d pods, want 4", len(pods))
	}
	for p, ps := range pods {
		if ps.Stats.Pod != fmt.Sprintf("pod-%d", p) {
			t.Fatalf("listing[%d] = %s", p, ps.Stats.Pod)
		}
		if int(ps.Blocks) != res.CachePerPod[p] {
			t.Errorf("pod %d: index holds %d blocks, pod caches %d", p, ps.Blocks, res.CachePerPod[p])
		}
	}
}
