package applier

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
)

// limitedEnv is an applierEnv whose applier has the given limits.
func limitedEnv(t *testing.T, cfg blockkeys.KeyConfig, idx kvindex.Index, l Limits) (*applierEnv, kvindex.Index) {
	t.Helper()
	e := newApplierEnv(t, cfg)
	hs, err := blockkeys.NewHasherSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.reg = prometheus.NewRegistry()
	e.m = NewMetrics(e.reg)
	if idx == nil {
		idx = e.idx
	}
	// The share accounting is the memory index's own, handed over
	// explicitly as the indexer does (a wrapper must not lose it).
	var share ShareAccounting
	if m, ok := idx.(*kvindex.MemoryIndex); ok && l.PodShare > 0 {
		share = m
	}
	if e.a, err = New(Config{Index: idx, Interner: e.in, Hashers: hs, Metrics: e.m,
		DigestCacheSize: 1024, AliasCacheSize: 1024, Limits: l, Share: share, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	return e, idx
}

func unverified(first, n int) event.Event {
	h := make([]uint64, n)
	for i := range h {
		h[i] = uint64(first + i)
	}
	return event.Event{Kind: event.BlockStored, BlockHashes: h}
}

// One pod publishing far more blocks than the index holds (an 11.6M-hash
// message) keeps to its share and evicts nobody; without the share the same
// flood evicts the other pod's blocks.
func TestPodShareFloodDoesNotEvictOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~200 MB")
	}
	capacity, flood := 1<<20, 11_600_000
	if race.Enabled {
		// the race detector makes millions of index writes take minutes
		capacity, flood = 1<<15, 3<<15
	}
	for _, tc := range []struct {
		share int
		flood int
		kept  bool
	}{{4, flood, true}, {0, 2 * capacity, false}} {
		victimBlocks := capacity / 512
		mem := kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: int64(capacity)})
		e, _ := limitedEnv(t, cborSeed0, mem, Limits{PodShare: tc.share})
		e.a.Apply(context.Background(), &event.Batch{Pod: "victim", Model: testModel, Events: []event.Event{unverified(1, victimBlocks)}})
		e.a.Apply(context.Background(), &event.Batch{Pod: "flood", Model: testModel, Events: []event.Event{unverified(1<<40, tc.flood)}})
		victim := e.podID("victim", 0)
		n, _ := mem.PodBlocks(context.Background(), victim)
		if kept := n == int64(victimBlocks); kept != tc.kept {
			t.Fatalf("share %d: victim holds %d of %d blocks", tc.share, n, victimBlocks)
		}
		if tc.share == 0 {
			continue
		}
		share := int64(capacity / tc.share)
		if got := mem.PodEntries(e.podID("flood", 0)); got != share {
			t.Fatalf("flooding pod holds %d entries, share %d", got, share)
		}
		if got := e.metric("kvindexd_pod_share_refused_blocks_total"); got != float64(int64(tc.flood)-share) {
			t.Fatalf("refused %v", got)
		}
		// what it removes makes room again
		e.a.Apply(context.Background(), &event.Batch{Pod: "flood", Model: testModel,
			Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: unverified(1<<40, 10).BlockHashes}}})
		e.a.Apply(context.Background(), &event.Batch{Pod: "flood", Model: testModel, Events: []event.Event{unverified(1<<50, 10)}})
		if got := mem.PodEntries(e.podID("flood", 0)); got != share {
			t.Fatalf("after removing 10 and storing 10: %d entries, share %d", got, share)
		}
	}
}

func TestDigestCachesBoundedAndFreed(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{MaxDigestCaches: 2})
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	for i, model := range []string{"m1", "m2", "m3"} {
		e.a.Apply(context.Background(), &event.Batch{Pod: "p" + model, Model: model, Events: []event.Event{stored(eh, toks, 4, 0, 2)}})
		if i == 2 {
			// m3 has no digest cache: its first block verifies, the
			// child (parent known only through the cache) cannot.
			e.a.Apply(context.Background(), &event.Batch{Pod: "pm3", Model: "m3", Events: []event.Event{stored(eh, toks, 4, 1, 2)}})
		}
	}
	if got := e.metric("kvindexd_digest_caches"); got != 2 {
		t.Fatalf("digest caches %v", got)
	}
	if got := e.metric("kvindexd_digest_cache_refused_total"); got != 1 {
		t.Fatalf("refused %v", got)
	}
	if p := e.pod("pm3", 0); p.ParityUnverified != 1 || p.ParityMatches != 2 {
		t.Fatalf("pod without a digest cache: %+v", p)
	}
	e.a.ForgetPod(context.Background(), "pm1", 0)
	if got := e.metric("kvindexd_digest_caches"); got != 1 {
		t.Fatalf("after forgetting m1's only pod: %v caches", got)
	}
	e.a.Apply(context.Background(), &event.Batch{Pod: "pm4", Model: "m4", Events: []event.Event{stored(eh, toks, 4, 0, 2)}})
	if got := e.metric("kvindexd_digest_caches"); got != 2 {
		t.Fatalf("a new model did not get the freed slot: %v", got)
	}
}

// Beyond MaxAliasTables a mismatching pod is indexed under the engine's
// hashes (removals stay exact); a cleared pod gives its table back.
func TestAliasTablesBounded(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{MaxAliasTables: 1})
	engineCfg := cborSeed0
	engineCfg.Seed = "1"
	toks := seq(7, 16)
	eh := engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{})
	ours := ourKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("a", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("b", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	a, b := e.podID("a", 0), e.podID("b", 0)
	if !e.idx.has(a, ours[0]) || !e.idx.has(b, blockkeys.Key(eh[0])) || e.idx.has(b, ours[0]) {
		t.Fatal("pod a should be aliased (own keys), pod b under the engine hashes")
	}
	if got := e.metric("kvindexd_alias_refused_blocks_total"); got != 2 {
		t.Fatalf("refused %v", got)
	}
	e.apply("b", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:2]})
	if e.idx.count(b) != 0 {
		t.Fatal("removal of an unaliased pod's blocks left entries")
	}
	e.apply("a", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared})
	if got := e.metric("kvindexd_alias_tables"); got != 0 {
		t.Fatalf("alias tables after clear %v", got)
	}
	e.apply("b", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	if !e.idx.has(b, ours[0]) {
		t.Fatal("pod b did not get the freed alias table")
	}
}

func TestForgetPod(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{})
	e.apply("gone", 0, blockkeys.EngineVLLM, unverified(1, 3))
	e.apply("stays", 0, blockkeys.EngineVLLM, unverified(1, 3))
	id := e.podID("gone", 0)
	e.a.ForgetPod(context.Background(), "gone", 0)
	e.a.ForgetPod(context.Background(), "never-seen", 0)
	if e.idx.count(id) != 0 {
		t.Fatal("forgotten pod still indexed")
	}
	for _, p := range e.a.PodStats() {
		if p.Pod == "gone" {
			t.Fatalf("forgotten pod still listed: %+v", p)
		}
	}
	if e.idx.count(e.podID("stays", 0)) != 3 {
		t.Fatal("other pod touched")
	}
	if got := e.metric("kvindexd_pods_forgotten_total"); got != 1 {
		t.Fatalf("forgotten %v", got)
	}
	// it may come back: a fresh state
	e.apply("gone", 0, blockkeys.EngineVLLM, unverified(10, 2))
	if p := e.pod("gone", 0); p.BlocksStored != 2 {
		t.Fatalf("returning pod %+v", p)
	}
}

// A pod that was refused a digest cache holds none: forgetting it leaves the
// cache another pod of its model got later.
func TestRefusedPodReleasesNoDigestCache(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{MaxDigestCaches: 1})
	ev := unverified(1, 1)
	e.a.Apply(context.Background(), &event.Batch{Pod: "a", Model: "m1", Events: []event.Event{ev}})
	e.a.Apply(context.Background(), &event.Batch{Pod: "b", Model: "m2", Events: []event.Event{ev}}) // refused
	e.a.ForgetPod(context.Background(), "a", 0)
	e.a.Apply(context.Background(), &event.Batch{Pod: "c", Model: "m2", Events: []event.Event{ev}}) // gets m2's cache
	e.a.ForgetPod(context.Background(), "b", 0)
	if got := e.metric("kvindexd_digest_caches"); got != 1 {
		t.Fatalf("digest caches %v, want c's", got)
	}
	e.a.ForgetPod(context.Background(), "c", 0)
	if got := e.metric("kvindexd_digest_caches"); got != 0 {
		t.Fatalf("digest caches %v after every pod left", got)
	}
}

// The share is a pod's across its DP ranks (issue 35: one pod on 5 ranks
// held 8.1M of 8.39M entries), and an engine snapshot's records are held to
// it like stored blocks (one snapshot of 4.19M records put them all on one
// pod). Both floods leave the victim's blocks in place.
func TestPodShareSpansRanksAndSnapshots(t *testing.T) {
	const capacity, share = 1 << 16, 1 << 14 // PodShare 4
	for _, tc := range []struct {
		name  string
		flood func(e *applierEnv)
	}{
		{"ranks", func(e *applierEnv) {
			for rank := range 5 {
				e.a.Apply(context.Background(), &event.Batch{Pod: "flood", DPRank: rank, Model: testModel,
					Events: []event.Event{unverified(1<<40+rank<<30, capacity/2)}})
			}
		}},
		{"snapshots", func(e *applierEnv) {
			for i := range 3 {
				ev := unverified(1<<40+i<<30, capacity)
				ev.Kind = event.BlockSnapshot
				e.a.Apply(context.Background(), &event.Batch{Pod: "flood", DPRank: i, Model: testModel, Events: []event.Event{ev}})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: capacity})
			e, _ := limitedEnv(t, cborSeed0, mem, Limits{PodShare: 4})
			victimBlocks := capacity / 8
			e.a.Apply(context.Background(), &event.Batch{Pod: "victim", Model: testModel, Events: []event.Event{unverified(1, victimBlocks)}})
			tc.flood(e)
			var held int64
			for _, id := range e.in.PodsNamed("flood") {
				held += mem.PodEntries(id)
			}
			if held != share {
				t.Errorf("the flooding pod holds %d entries over its ranks, its share is %d", held, share)
			}
			if n, _ := mem.PodBlocks(context.Background(), e.podID("victim", 0)); n != int64(victimBlocks) {
				t.Errorf("victim holds %d of its %d blocks (evictions %d)", n, victimBlocks, mem.Stats().Evictions)
			}
		})
	}
}
