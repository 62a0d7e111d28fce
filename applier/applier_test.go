package applier

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/setassoc"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The applier tests produce "engine" hashes with our Hasher under a chosen
// config (the Hasher itself is pinned by the golden vectors in hash_test.go)
// and check what the applier indexes when that config equals or differs from
// kvindex's.

const testModel = "m"

type applierEnv struct {
	t    *testing.T
	idx  *fakeIndex
	in   *kvindex.Interner
	a    *Applier
	m    *Metrics
	reg  *prometheus.Registry
	logs *bytes.Buffer
	cfg  blockkeys.KeyConfig
}

func newApplierEnv(t *testing.T, cfg blockkeys.KeyConfig) *applierEnv {
	t.Helper()
	return newApplierEnvHeld(t, cfg, false)
}

// newApplierEnvHeld is newApplierEnv whose index, with reportsHeld, reports
// which keys a pod already held (kvindex.HeldAdder, as the in-memory index
// does): the applier then counts copies from that answer (holding.go).
func newApplierEnvHeld(t *testing.T, cfg blockkeys.KeyConfig, reportsHeld bool) *applierEnv {
	t.Helper()
	hs, err := blockkeys.NewHasherSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &applierEnv{t: t, idx: newFakeIndex(), in: kvindex.NewInterner(), reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}, cfg: cfg}
	e.m = NewMetrics(e.reg)
	var held kvindex.HeldAdder
	if reportsHeld {
		held = heldFakeIndex{e.idx}
	}
	if e.a, err = New(Config{Index: e.idx, Held: held, Interner: e.in, Hashers: hs, Metrics: e.m,
		DigestCacheSize: 1024, AliasCacheSize: 1024,
		Logger: slog.New(slog.NewTextHandler(&syncWriter{w: e.logs}, nil))}); err != nil {
		t.Fatal(err)
	}
	return e
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// engineKeys hashes tokens as an engine configured with cfg would.
func engineKeys(t *testing.T, cfg blockkeys.KeyConfig, tokens []uint32, x blockkeys.RequestExtras) []uint64 {
	t.Helper()
	h, err := blockkeys.NewHasher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, k := range h.Keys(nil, tokens, x) {
		out = append(out, uint64(k))
	}
	return out
}

func ourKeys(t *testing.T, cfg blockkeys.KeyConfig, tokens []uint32, x blockkeys.RequestExtras) []blockkeys.Key {
	h, _ := blockkeys.NewHasher(cfg)
	return h.Keys(nil, tokens, x)
}

// stored builds a vLLM-style BlockStored for blocks [from, to) of tokens.
func stored(hashes []uint64, tokens []uint32, bs, from, to int) event.Event {
	ev := event.Event{Kind: event.BlockStored, BlockHashes: hashes[from:to], TokenIDs: tokens[from*bs : to*bs], BlockSize: bs}
	if from > 0 {
		ev.ParentHash, ev.HasParent = hashes[from-1], true
	}
	return ev
}

func (e *applierEnv) apply(pod string, rank int, engine blockkeys.Engine, evs ...event.Event) event.ApplyOutcome {
	return e.a.Apply(context.Background(), &event.Batch{Pod: pod, Model: testModel, DPRank: rank, Engine: engine, Events: evs})
}

func (e *applierEnv) pod(name string, rank int) PodStats {
	for _, p := range e.a.PodStats() {
		if p.Pod == name && p.DPRank == rank {
			return p
		}
	}
	e.t.Fatalf("pod %s/%d not listed", name, rank)
	return PodStats{}
}

func (e *applierEnv) podID(name string, rank int) kvindex.PodID {
	id, ok := e.in.LookupPod(name, rank)
	if !ok {
		e.t.Fatalf("pod %s/%d not interned", name, rank)
	}
	return id
}

func (e *applierEnv) metric(name string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += metricValue(m)
		}
	}
	return sum
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

var cborSeed0 = blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "0", BlockSize: 4}

func TestApplierTierGroupAndDPRank(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 4)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	ev := stored(eh, toks, 4, 0, 1)
	ev.Medium, ev.GroupIdx = event.TierDisk, 2
	e.apply("p", 1, blockkeys.EngineVLLM, ev)
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	m, _ := e.in.LookupModel(testModel)
	id1 := e.podID("p", 1)
	// The tier is kept; the group is not part of the index (only
	// full-attention groups are indexed, and a block counts once all of
	// them hold it).
	if _, ok := e.idx.held[fakeEntry{m, id1, event.TierDisk, blockkeys.Key(eh[0])}]; !ok {
		t.Fatalf("tier not kept: %v", e.idx.held)
	}
	if id1 == e.podID("p", 0) || len(e.a.PodStats()) != 2 {
		t.Fatal("DP ranks must be separate pods")
	}
	// removal on one tier leaves the other
	e.apply("p", 1, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh, Medium: event.TierGPU, GroupIdx: 2})
	if e.idx.count(id1) != 1 {
		t.Fatal("removal crossed tiers")
	}
}

// go test -race ./kvindex/ -run Applier: several pods apply concurrently
// (one goroutine per pod, as kvevents does) while stats and metrics are read.
func TestApplierConcurrentRace(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 64)
	good := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	bad := engineKeys(t, blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "9", BlockSize: 4}, toks, blockkeys.RequestExtras{})
	var wg sync.WaitGroup
	for p := 0; p < 6; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			eh, eng := good, blockkeys.EngineVLLM
			if p%2 == 1 {
				eh = bad
			}
			if p == 4 {
				eng = blockkeys.EngineSGLang
			}
			name := fmt.Sprintf("pod-%d", p)
			for r := 0; r < 20; r++ {
				for b := 0; b < 16; b += 4 {
					e.apply(name, p%2, eng, stored(eh, toks, 4, b, b+4))
				}
				e.apply(name, p%2, eng, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[8:]})
				if r%5 == 0 {
					e.apply(name, p%2, eng, event.Event{Kind: event.AllBlocksCleared})
				}
			}
		}(p)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
				e.a.PodStats()
				e.reg.Gather()
			}
		}
	}()
	wg.Wait()
	close(done)
	for _, p := range e.a.PodStats() {
		if p.EventsApplied != 20*5+4 {
			t.Errorf("%s: %d events", p.Pod, p.EventsApplied)
		}
	}
	if e.pod("pod-1", 1).ParityMismatches == 0 || e.pod("pod-0", 0).ParityMatches == 0 {
		t.Error("parity not counted")
	}
}

func TestCacheTablesBounded(t *testing.T) {
	dc := newDigestCache(64)
	at := newAliasTable(64)
	var d [32]byte
	for i := uint64(0); i < 10000; i++ {
		d[0] = byte(i)
		dc.put(i*0x1234567, &d)
		at.put(i*0x1234567, blockkeys.Key(i))
	}
	if len(dc.sets)*setassoc.Ways != 64 || len(at.sets)*setassoc.Ways != 64 {
		t.Fatal("tables grew")
	}
	var got [32]byte
	if !dc.get(9999*0x1234567, &got) || got[0] != byte(9999%256) {
		t.Fatal("latest digest evicted")
	}
	if k, ok := at.get(9999 * 0x1234567); !ok || k != 9999 {
		t.Fatal("latest alias evicted")
	}
	at.put(9999*0x1234567, 5)
	if k, _ := at.get(9999 * 0x1234567); k != 5 {
		t.Fatal("alias not updated in place")
	}
}

func TestApplierSteadyStateDoesNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	// nopIndex: the applier alone; the in-memory index: with its answer
	// of what a pod held (kvindex.HeldAdder), and a second copy of blocks
	// 0-3 counted from it in every batch.
	testApplierSteadyStateDoesNotAllocate(t, nopIndex{}, nil)
	mem := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
	testApplierSteadyStateDoesNotAllocate(t, mem, mem)
}

func testApplierSteadyStateDoesNotAllocate(t *testing.T, idx kvindex.Index, held kvindex.HeldAdder) {
	cfg := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
	hs, _ := blockkeys.NewHasherSet(cfg, nil)
	a, err := New(Config{Index: idx, Held: held, Interner: kvindex.NewInterner(), Hashers: hs, DigestCacheSize: 1024, AliasCacheSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	toks := seq(1000, 16*8)
	for _, engine := range []blockkeys.KeyConfig{cfg, {Algo: blockkeys.AlgoSHA256, Seed: "1", BlockSize: 16}} {
		eh := engineKeys(t, engine, toks, blockkeys.RequestExtras{LoraName: "x"})
		evs := []event.Event{stored(eh, toks, 16, 0, 4), stored(eh, toks, 16, 4, 8), stored(eh, toks, 16, 0, 4),
			{Kind: event.BlockRemoved, BlockHashes: eh}, {Kind: event.BlockRemoved, BlockHashes: eh[:4]}}
		for i := range evs {
			evs[i].LoraName = "x"
		}
		evs[1].LoraName = ""
		evs[1].ExtraKeys = [][]any{{"x"}, {"x"}, {"x"}, {"x"}} // generic path, same keys
		b := &event.Batch{Pod: "p-" + engine.Seed, Model: "m", Events: evs}
		a.Apply(context.Background(), b) // warm: pod state, tables, scratch buffers
		if n := testing.AllocsPerRun(50, func() { a.Apply(context.Background(), b) }); n != 0 {
			t.Errorf("%T, seed %s: %v allocs per batch", idx, engine.Seed, n)
		}
	}
}
