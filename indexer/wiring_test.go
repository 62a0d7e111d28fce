package indexer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// The composition root hands each part its capabilities explicitly. These
// tests wire the indexer the way the daemon does (prediction sampling on,
// which wraps the applier's view of the index) and check that every
// capability still reaches the part that enforces it.

// One pod flooding the index stops at its share and evicts nobody, with
// the prediction wrapper between the applier and the index (the daemon's
// default). The share once came from a type assertion on the wrapped
// index, which failed there and switched the share off without a word.
func TestPodShareHoldsBehindThePredictionWrapper(t *testing.T) {
	for _, rate := range []float64{0, 0.01, 1} {
		reg := prometheus.NewRegistry()
		ix := newTestIndexer(t, Config{Index: IndexConfig{Capacity: 4096}, Registry: reg,
			Prediction:    PredictionConfig{SampleRate: rate},
			ApplierLimits: applier.Limits{PodShare: 4}})
		prompt := seqTokens(1, 8*testBlock)
		for _, pod := range []string{"pod-a", "pod-b", "pod-c"} {
			apply(ix, pod, 0, storeEvent(prompt, 8, event.TierGPU))
		}
		// hash-only blocks, 4x the whole index
		flood := make([]uint64, 4*4096)
		for i := range flood {
			flood[i] = uint64(1<<40 + i)
		}
		apply(ix, "flooder", 0, event.Event{Kind: event.BlockStored, BlockHashes: flood, BlockSize: testBlock})
		var r Result
		if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r); !strings.Contains(got, "pod-a:8/") ||
			!strings.Contains(got, "pod-b:8/") || !strings.Contains(got, "pod-c:8/") {
			t.Fatalf("rate %v: the fleet after one pod's flood: %s", rate, got)
		}
		if got := gatherValue(t, reg, "kvindexd_pod_share_refused_blocks_total"); got != float64(len(flood)-1024) {
			t.Fatalf("rate %v: refused %v blocks, want %d", rate, got, len(flood)-1024)
		}
	}
}

// The sink kvevents delivers to forgets a pod: the applier drops its state
// (kvindexd_pods_forgotten_total). kvevents once found ForgetPod by a type
// assertion on the sink, which the indexer's wrapper sink did not pass on.
func TestSinkForgetsPodsThroughTheApplier(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Registry: reg, Prediction: PredictionConfig{SampleRate: 0.01}})
	apply(ix, "gone", 0, storeEvent(seqTokens(1, 4*testBlock), 4, event.TierGPU))
	ix.Sink().ForgetPod(context.Background(), "gone", 0)
	if got := gatherValue(t, reg, "kvindexd_pods_forgotten_total"); got != 1 {
		t.Fatalf("pods forgotten %v, want 1", got)
	}
	if pods := ix.applier.PodStats(); len(pods) != 0 {
		t.Fatalf("applier still holds %+v", pods)
	}
}

// Silent streams expire end to end: subscriber, sink, applier.
func TestPodExpiryForgetsThroughTheSubscriber(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Registry: reg, Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0", PodExpiry: 50 * time.Millisecond}})
	apply(ix, "quiet", 0, storeEvent(seqTokens(1, 4*testBlock), 4, event.TierGPU))
	ix.Subscriber().ResumeFrom("quiet", 0, 1, true) // the stream the batch came through
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait.For(t, "the silent pod forgotten", func() bool { return gatherValue(t, reg, "kvindexd_pods_forgotten_total") == 1 })
}

// A feature whose backend lacks what it needs fails at start, with the
// reason; it is never switched off in silence.
func TestMissingCapabilityIsAStartError(t *testing.T) {
	srv := redistest.Start(t)
	redisIdx := IndexConfig{Redis: &redisindex.Config{URL: srv.URL(), Namespace: "caps"}}
	events := &kvevents.Config{Bind: "tcp://127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"pod share on redis", Config{Index: redisIdx, ApplierLimits: applier.Limits{PodShare: 4}}, "pod share"},
		{"pod share on a custom backend without accounting",
			Config{Backend: withBackend(kvindex.NewMemoryIndex(kvindex.MemoryConfig{})), ApplierLimits: applier.Limits{PodShare: 4}}, "pod share"},
		{"persistence on redis", Config{Index: redisIdx, Events: events, Persist: PersistConfig{Path: t.TempDir() + "/s", Interval: time.Minute}}, "in-memory"},
		{"persistence without events", Config{Persist: PersistConfig{Path: t.TempDir() + "/s", Interval: time.Minute}}, "subscriber"},
		{"leases in memory", Config{Events: &kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Address: "tcp://127.0.0.1:1"}}},
			Leases: LeaseConfig{Enabled: true, TTL: time.Second}}, "Redis"},
	} {
		tc.cfg.Keys = testKeys
		ix, err := New(context.Background(), tc.cfg)
		if err == nil {
			_ = ix.Close()
			t.Errorf("%s: started", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to name %q", tc.name, err, tc.want)
		}
	}
	if _, err := applier.New(applier.Config{Index: kvindex.NewMemoryIndex(kvindex.MemoryConfig{}),
		Interner: kvindex.NewInterner(), Hashers: testHashers, Limits: applier.Limits{PodShare: 2}}); !errors.Is(err, applier.ErrNoShareAccounting) {
		t.Errorf("applier with a share and no accounting: %v", err)
	}
}

// The built-in backends declare every capability their type has: a
// capability the type implements but the Backend leaves nil would be a
// silent off. (This is the one place a type assertion is right: it checks
// the declaration against the real store, as raft checks its log store.)
func TestBuiltInBackendsDeclareEveryCapability(t *testing.T) {
	srv := redistest.Start(t)
	r, err := redisindex.New(context.Background(), redisindex.Config{URL: srv.URL(), Interner: kvindex.NewInterner()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, b := range []Backend{MemoryBackend(kvindex.NewMemoryIndex(kvindex.MemoryConfig{})), RedisBackend(r)} {
		idx := b.Index
		if _, ok := idx.(kvindex.HealthChecker); ok != (b.Health != nil) {
			t.Errorf("%T: health declared %v", idx, b.Health != nil)
		}
		if _, ok := idx.(kvindex.SharedNames); ok != (b.Names != nil) {
			t.Errorf("%T: shared names declared %v", idx, b.Names != nil)
		}
		if _, ok := idx.(kvindex.PodBlocksBatcher); ok != (b.Batch != nil) {
			t.Errorf("%T: batched pod blocks declared %v", idx, b.Batch != nil)
		}
		if _, ok := idx.(kvindex.PrefixScorer); ok != (b.Prefix != nil) {
			t.Errorf("%T: prefix scoring declared %v", idx, b.Prefix != nil)
		}
		if _, ok := idx.(applier.ShareAccounting); ok != (b.Share != nil) {
			t.Errorf("%T: share accounting declared %v", idx, b.Share != nil)
		}
		if _, ok := idx.(interface{ Close() error }); ok != (b.Close != nil) {
			t.Errorf("%T: close declared %v", idx, b.Close != nil)
		}
	}
}

// The in-memory index reports which blocks a pod already held as it adds
// them (kvindex.HeldAdder), so the applier keeps no copy count for a block
// stored once; the prediction wrapper (on by default) must pass that on.
// Without it the daemon kept a copy-count entry per block, a memory miss per
// stored and per removed block.
func TestCopiesCountedFromTheIndexBehindThePredictionWrapper(t *testing.T) {
	for _, rate := range []float64{0, 0.01, 1} {
		reg := prometheus.NewRegistry()
		ix := newTestIndexer(t, Config{Registry: reg, Prediction: PredictionConfig{SampleRate: rate}})
		prompt := seqTokens(1, 8*testBlock)
		b := &event.Batch{Pod: "pod-a", Model: testModel, Engine: blockkeys.EngineVLLM,
			Events: []event.Event{storeEvent(prompt, 8, event.TierGPU)}}
		ix.Sink().Apply(context.Background(), b)
		if got := gatherValue(t, reg, "kvindexd_hold_table_bytes"); got != 0 {
			t.Fatalf("rate %v: copy tables of %v bytes for blocks stored once", rate, got)
		}
		// A second copy of the blocks is counted: one removal keeps them.
		ix.Sink().Apply(context.Background(), b)
		if got := gatherValue(t, reg, "kvindexd_hold_table_bytes"); got == 0 {
			t.Fatalf("rate %v: no copy table for blocks stored twice", rate)
		}
		hashes := b.Events[0].BlockHashes
		var r Result
		rm := &event.Batch{Pod: "pod-a", Model: testModel, Engine: blockkeys.EngineVLLM,
			Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: hashes}}}
		ix.Sink().Apply(context.Background(), rm)
		if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r); !strings.Contains(got, "pod-a:8/") {
			t.Fatalf("rate %v: after one of two copies was removed: %s", rate, got)
		}
		ix.Sink().Apply(context.Background(), rm)
		if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r); strings.Contains(got, "pod-a") {
			t.Fatalf("rate %v: after both copies were removed: %s", rate, got)
		}
	}
}
