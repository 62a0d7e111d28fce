package kvindex

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

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
	in   *Interner
	a    *Applier
	m    *Metrics
	reg  *prometheus.Registry
	logs *bytes.Buffer
	cfg  KeyConfig
}

func newApplierEnv(t *testing.T, cfg KeyConfig) *applierEnv {
	t.Helper()
	hs, err := NewHasherSet(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &applierEnv{t: t, idx: newFakeIndex(), in: NewInterner(), reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}, cfg: cfg}
	e.m = NewMetrics(e.reg)
	if e.a, err = NewApplier(ApplierConfig{Index: e.idx, Interner: e.in, Hashers: hs, Metrics: e.m,
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
func engineKeys(t *testing.T, cfg KeyConfig, tokens []uint32, x RequestExtras) []uint64 {
	t.Helper()
	h, err := NewHasher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, k := range h.Keys(nil, tokens, x) {
		out = append(out, uint64(k))
	}
	return out
}

func ourKeys(t *testing.T, cfg KeyConfig, tokens []uint32, x RequestExtras) []Key {
	h, _ := NewHasher(cfg)
	return h.Keys(nil, tokens, x)
}

// stored builds a vLLM-style BlockStored for blocks [from, to) of tokens.
func stored(hashes []uint64, tokens []uint32, bs, from, to int) Event {
	ev := Event{Kind: BlockStored, BlockHashes: hashes[from:to], TokenIDs: tokens[from*bs : to*bs], BlockSize: bs}
	if from > 0 {
		ev.ParentHash, ev.HasParent = hashes[from-1], true
	}
	return ev
}

func (e *applierEnv) apply(pod string, rank int, engine Engine, evs ...Event) {
	e.a.Apply(context.Background(), &Batch{Pod: pod, Model: testModel, DPRank: rank, Engine: engine, Events: evs})
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

func (e *applierEnv) podID(name string, rank int) PodID {
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

var cborSeed0 = KeyConfig{Algo: AlgoSHA256CBOR, Seed: "0", BlockSize: 4}

func TestApplierParityMatch(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(100, 24) // 6 blocks
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p1", 0, EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("p1", 0, EngineVLLM, stored(eh, toks, 4, 2, 5), stored(eh, toks, 4, 5, 6))
	p := e.pod("p1", 0)
	if p.ParityMatches != 6 || p.ParityMismatches != 0 || p.ParityUnverified != 0 || p.ParityHint != "" {
		t.Fatalf("parity %+v", p)
	}
	if p.EventsApplied != 3 || p.BlocksStored != 6 || p.Model != testModel || p.Engine != EngineVLLM || p.LastEvent.IsZero() {
		t.Fatalf("stats %+v", p)
	}
	id := e.podID("p1", 0)
	for _, k := range eh {
		if !e.idx.has(id, Key(k)) {
			t.Fatalf("key %d not indexed", k)
		}
	}
	e.apply("p1", 0, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: eh[4:]})
	if e.idx.count(id) != 4 || e.idx.has(id, Key(eh[5])) {
		t.Fatalf("after removal: %d held", e.idx.count(id))
	}
	if got := e.metric("kvindexd_parity_matches_total"); got != 6 {
		t.Errorf("parity_matches_total %v", got)
	}
	if got := e.metric("kvindexd_events_applied_total"); got != 4 {
		t.Errorf("events_applied_total %v", got)
	}
	if got := e.metric("kvindexd_blocks_removed_total"); got != 2 {
		t.Errorf("blocks_removed_total %v", got)
	}
	if got := e.metric("kvindexd_blocks_stored_total"); got != 6 {
		t.Errorf("blocks_stored_total %v", got)
	}
}

// A pod whose seed differs: blocks are indexed under OUR keys, engine hashes
// are aliased so BlockRemoved works (dual key), and the hint names the seed.
func TestApplierParityMismatchSeedDualKey(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	engineCfg := cborSeed0
	engineCfg.Seed = "1"
	toks := seq(7, 16)
	eh := engineKeys(t, engineCfg, toks, RequestExtras{})
	ours := ourKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p1", 0, EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("p1", 0, EngineVLLM, stored(eh, toks, 4, 2, 4)) // parent known via the digest cache
	p := e.pod("p1", 0)
	if p.ParityMismatches != 4 || p.ParityMatches != 0 || p.ParityUnverified != 0 {
		t.Fatalf("parity %+v", p)
	}
	if !strings.HasPrefix(p.ParityHint, "seed:") {
		t.Fatalf("hint %q", p.ParityHint)
	}
	id := e.podID("p1", 0)
	for i, k := range ours {
		if !e.idx.has(id, k) || e.idx.has(id, Key(eh[i])) {
			t.Fatalf("block %d: own key not indexed or engine hash indexed", i)
		}
	}
	e.apply("p1", 0, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: []uint64{eh[3], eh[1]}})
	if e.idx.has(id, ours[3]) || e.idx.has(id, ours[1]) || !e.idx.has(id, ours[0]) || !e.idx.has(id, ours[2]) {
		t.Fatal("dual-key removal removed the wrong blocks")
	}
	if got := e.metric("kvindexd_unresolved_removals_total"); got != 0 {
		t.Errorf("unresolved %v", got)
	}
	e.apply("p1", 0, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: []uint64{12345}})
	if got := e.metric("kvindexd_unresolved_removals_total"); got != 1 {
		t.Errorf("unresolved after unknown hash: %v", got)
	}
	if n := strings.Count(e.logs.String(), "parity mismatch"); n != 1 {
		t.Errorf("hint logged %d times:\n%s", n, e.logs.String())
	}
}

func TestApplierParityHintAlgorithm(t *testing.T) {
	for _, algo := range []HashAlgo{AlgoSHA256, AlgoXXHash, AlgoXXHashCBOR} {
		e := newApplierEnv(t, cborSeed0)
		engineCfg := cborSeed0
		engineCfg.Algo = algo
		toks := seq(1, 8)
		eh := engineKeys(t, engineCfg, toks, RequestExtras{LoraName: "ad"})
		ev := stored(eh, toks, 4, 0, 2)
		ev.LoraName = "ad"
		e.apply("p", 0, EngineVLLM, ev)
		p := e.pod("p", 0)
		if !strings.HasPrefix(p.ParityHint, "hash algorithm:") || !strings.Contains(p.ParityHint, string(algo)) {
			t.Errorf("%s: hint %q", algo, p.ParityHint)
		}
		if p.ParityMismatches != 2 {
			t.Errorf("%s: %+v", algo, p)
		}
	}
}

func TestApplierParityHintBlockSize(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	engineCfg := cborSeed0
	engineCfg.BlockSize = 8
	toks := seq(1, 16)
	eh := engineKeys(t, engineCfg, toks, RequestExtras{})
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 8, 0, 2))
	p := e.pod("p", 0)
	if !strings.HasPrefix(p.ParityHint, "block size:") || p.ParityMismatches != 2 || p.ParityUnverified != 0 {
		t.Fatalf("%+v", p)
	}
	// nothing better to index than what the engine says
	if !e.idx.has(e.podID("p", 0), Key(eh[1])) {
		t.Fatal("engine hash not indexed")
	}
}

func TestApplierParityUnverified(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(50, 16)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	// parent never seen: cannot check, indexed as the engine says
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 2, 4))
	// CPU offload style: no token ids, block_size 0
	e.apply("p", 0, EngineVLLM, Event{Kind: BlockStored, BlockHashes: eh[:2], Medium: TierCPU})
	// LoRA id without name or extra_keys: the extra keys are unknown
	e.apply("p", 0, EngineVLLM, Event{Kind: BlockStored, BlockHashes: eh[:1], TokenIDs: toks[:4], BlockSize: 4, LoraID: 3, HasLoraID: true})
	p := e.pod("p", 0)
	if p.ParityUnverified != 5 || p.ParityMatches != 0 || p.ParityMismatches != 0 || p.ParityHint != "" {
		t.Fatalf("%+v", p)
	}
	id := e.podID("p", 0)
	for _, k := range eh {
		if !e.idx.has(id, Key(k)) {
			t.Fatalf("engine hash %d not indexed", k)
		}
	}
	// the chain resumes once the parent is known: block 0 verified, then 1..3
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 1), stored(eh, toks, 4, 1, 4))
	if p := e.pod("p", 0); p.ParityMatches != 4 {
		t.Fatalf("%+v", p)
	}
}

// Extra keys: generic per-block extra_keys from the event take precedence,
// else lora_name; vLLM's cache_salt only reaches us through extra_keys.
func TestApplierExtraKeys(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(9, 12)
	x := RequestExtras{LoraName: "lora-a", CacheSalt: "salt"}
	eh := engineKeys(t, cborSeed0, toks, x)
	ev := stored(eh, toks, 4, 0, 3)
	ev.LoraName = "lora-a" // ignored: extra_keys present
	ev.ExtraKeys = [][]any{{"lora-a", "salt"}, {"lora-a"}, {"lora-a"}}
	e.apply("p", 0, EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 3 {
		t.Fatalf("extra_keys: %+v", p)
	}
	eh2 := engineKeys(t, cborSeed0, toks, RequestExtras{LoraName: "lora-b"})
	ev = stored(eh2, toks, 4, 0, 3)
	ev.LoraName = "lora-b"
	e.apply("q", 0, EngineVLLM, ev)
	if p := e.pod("q", 0); p.ParityMatches != 3 {
		t.Fatalf("lora_name: %+v", p)
	}
	// an extra-key value we cannot serialise: unverified, not an error
	ev = stored(eh, toks, 4, 0, 1)
	ev.ExtraKeys = [][]any{{1.5}}
	e.apply("r", 0, EngineVLLM, ev)
	if p := e.pod("r", 0); p.ParityUnverified != 1 || p.IndexErrors != 0 {
		t.Fatalf("float extra key: %+v", p)
	}
}

// SGLang hashes are not vLLM's: blocks are indexed under our keys (with the
// request's cache_salt on its first block) and SGLang hashes are aliased.
func TestApplierSGLang(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(300, 12)
	sg := []uint64{0xfffffffffffffff1, 42, 0x8000000000000003} // signed int64s from SGLang
	x := RequestExtras{CacheSalt: "tenant"}
	ours := ourKeys(t, cborSeed0, toks, x)
	ev := Event{Kind: BlockStored, BlockHashes: sg[:2], TokenIDs: toks[:8], BlockSize: 4, CacheSalt: "tenant"}
	ev2 := Event{Kind: BlockStored, BlockHashes: sg[2:], ParentHash: sg[1], HasParent: true, TokenIDs: toks[8:], BlockSize: 4, CacheSalt: "tenant"}
	e.apply("s", 0, EngineSGLang, ev, ev2)
	id := e.podID("s", 0)
	for i, k := range ours {
		if !e.idx.has(id, k) {
			t.Fatalf("own key %d missing", i)
		}
	}
	if e.idx.count(id) != 3 {
		t.Fatalf("%d entries", e.idx.count(id))
	}
	p := e.pod("s", 0)
	if p.ParityMatches+p.ParityMismatches+p.ParityUnverified != 0 || p.Engine != EngineSGLang {
		t.Fatalf("%+v", p)
	}
	// no token ids: nothing usable to index
	e.apply("s", 0, EngineSGLang, Event{Kind: BlockStored, BlockHashes: []uint64{77}})
	if e.idx.count(id) != 3 || e.metric("kvindexd_blocks_unkeyed_total") != 1 {
		t.Fatal("unkeyed SGLang block indexed")
	}
	e.apply("s", 0, EngineSGLang, Event{Kind: BlockRemoved, BlockHashes: []uint64{sg[2], 99}})
	if e.idx.has(id, ours[2]) || e.idx.count(id) != 2 {
		t.Fatal("SGLang removal not translated")
	}
	if got := e.metric("kvindexd_unresolved_removals_total"); got != 1 {
		t.Errorf("unresolved %v", got)
	}
	e.apply("s", 0, EngineSGLang, Event{Kind: AllBlocksCleared})
	if e.idx.count(id) != 0 || e.pod("s", 0).Clears != 1 {
		t.Fatal("AllBlocksCleared")
	}
}

func TestApplierTierGroupAndDPRank(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 4)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	ev := stored(eh, toks, 4, 0, 1)
	ev.Medium, ev.GroupIdx = TierDisk, 2
	e.apply("p", 1, EngineVLLM, ev)
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	m, _ := e.in.LookupModel(testModel)
	id1 := e.podID("p", 1)
	// The tier is kept; the group is not part of the index (only
	// full-attention groups are indexed, and a block counts once all of
	// them hold it).
	if _, ok := e.idx.held[fakeEntry{m, id1, TierDisk, Key(eh[0])}]; !ok {
		t.Fatalf("tier not kept: %v", e.idx.held)
	}
	if id1 == e.podID("p", 0) || len(e.a.PodStats()) != 2 {
		t.Fatal("DP ranks must be separate pods")
	}
	// removal on one tier leaves the other
	e.apply("p", 1, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: eh, Medium: TierGPU, GroupIdx: 2})
	if e.idx.count(id1) != 1 {
		t.Fatal("removal crossed tiers")
	}
}

// The applier error contract: an index error counts, marks the pod untrusted
// and drops the rest of the batch; the next batch first clears the pod, and
// only a successful clear makes it trusted again.
func TestApplierUntrustedRecovery(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 16)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	id := e.podID("p", 0)

	e.idx.mu.Lock()
	e.idx.failOn = 2 // the second call from now fails
	e.idx.mu.Unlock()
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 1, 2), stored(eh, toks, 4, 2, 3), stored(eh, toks, 4, 3, 4))
	p := e.pod("p", 0)
	if !p.Untrusted || p.IndexErrors != 1 || p.EventsApplied != 2 || e.idx.has(id, Key(eh[3])) {
		t.Fatalf("after failure: %+v", p)
	}
	if e.metric("kvindexd_untrusted_pods") != 1 || e.metric("kvindexd_index_errors_total") != 1 {
		t.Fatal("metrics after failure")
	}

	e.idx.setDown(true)
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 3, 4))
	p = e.pod("p", 0)
	if !p.Untrusted || p.IndexErrors != 2 || p.EventsApplied != 2 {
		t.Fatalf("while down: %+v", p)
	}
	calls := e.idx.log()
	if last := calls[len(calls)-1]; !strings.HasPrefix(last, "clear") {
		t.Fatalf("untrusted pod's batch did not start with ClearPod: %v", calls)
	}

	e.idx.setDown(false)
	n := len(e.idx.log())
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 2))
	calls = e.idx.log()[n:]
	if len(calls) != 2 || calls[0] != fmt.Sprintf("clear pod=%d", id) || !strings.HasPrefix(calls[1], "add") {
		t.Fatalf("recovery calls %v", calls)
	}
	p = e.pod("p", 0)
	if p.Untrusted || p.EventsApplied != 3 || e.idx.count(id) != 2 {
		t.Fatalf("after recovery: %+v, %d held", p, e.idx.count(id))
	}
	if e.metric("kvindexd_untrusted_pods") != 0 || e.metric("kvindexd_recovery_clears_total") != 1 {
		t.Fatal("metrics after recovery")
	}
	// other pods are unaffected by one pod's trouble
	e.apply("other", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	if e.pod("other", 0).Untrusted {
		t.Fatal("other pod untrusted")
	}
}

func TestApplierAllBlocksClearedError(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	e.idx.setDown(true)
	e.apply("p", 0, EngineVLLM, Event{Kind: AllBlocksCleared})
	if p := e.pod("p", 0); !p.Untrusted || p.Clears != 0 || p.IndexErrors != 1 {
		t.Fatalf("%+v", p)
	}
}

// go test -race ./kvindex/ -run Applier: several pods apply concurrently
// (one goroutine per pod, as kvevents does) while stats and metrics are read.
func TestApplierConcurrentRace(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 64)
	good := engineKeys(t, cborSeed0, toks, RequestExtras{})
	bad := engineKeys(t, KeyConfig{Algo: AlgoSHA256CBOR, Seed: "9", BlockSize: 4}, toks, RequestExtras{})
	var wg sync.WaitGroup
	for p := 0; p < 6; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			eh, eng := good, EngineVLLM
			if p%2 == 1 {
				eh = bad
			}
			if p == 4 {
				eng = EngineSGLang
			}
			name := fmt.Sprintf("pod-%d", p)
			for r := 0; r < 20; r++ {
				for b := 0; b < 16; b += 4 {
					e.apply(name, p%2, eng, stored(eh, toks, 4, b, b+4))
				}
				e.apply(name, p%2, eng, Event{Kind: BlockRemoved, BlockHashes: eh[8:]})
				if r%5 == 0 {
					e.apply(name, p%2, eng, Event{Kind: AllBlocksCleared})
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
		at.put(i*0x1234567, Key(i))
	}
	if len(dc.sets)*cacheWays != 64 || len(at.sets)*cacheWays != 64 {
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

// A pod whose other blocks match but whose salted request's blocks differ
// (vLLM without extra_keys does not publish cache_salt): its configuration is
// right, so its own hashes are indexed and the hint names extra keys.
func TestApplierPartialMismatchExtraKeys(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	plain := engineKeys(t, cborSeed0, toks, RequestExtras{})
	salted := engineKeys(t, cborSeed0, toks, RequestExtras{CacheSalt: "tenant"})
	e.apply("p", 0, EngineVLLM, stored(plain, toks, 4, 0, 2))
	e.apply("p", 0, EngineVLLM, stored(salted, toks, 4, 0, 2))
	p := e.pod("p", 0)
	if p.ParityMatches != 2 || p.ParityMismatches != 2 || !strings.HasPrefix(p.ParityHint, "extra keys:") {
		t.Fatalf("%+v", p)
	}
	id := e.podID("p", 0)
	for _, k := range append(plain, salted...) {
		if !e.idx.has(id, Key(k)) {
			t.Fatalf("engine hash %d not indexed", k)
		}
	}
	e.apply("p", 0, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: salted})
	if e.idx.count(id) != 2 {
		t.Fatalf("%d held after removing the salted blocks", e.idx.count(id))
	}
}

// An engine restarted with the right seed: AllBlocksCleared drops the old
// conclusion, so the stale hint does not outlive its cause.
func TestApplierClearResetsParityHint(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	wrong := cborSeed0
	wrong.Seed = "7"
	toks := seq(1, 8)
	e.apply("p", 0, EngineVLLM, stored(engineKeys(t, wrong, toks, RequestExtras{}), toks, 4, 0, 2))
	if e.pod("p", 0).ParityHint == "" {
		t.Fatal("no hint")
	}
	right := engineKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p", 0, EngineVLLM, Event{Kind: AllBlocksCleared}, stored(right, toks, 4, 0, 2))
	p := e.pod("p", 0)
	if p.ParityHint != "" || p.ParityMatches != 2 || p.Clears != 1 {
		t.Fatalf("%+v", p)
	}
	if !e.idx.has(e.podID("p", 0), Key(right[1])) {
		t.Fatal("matching block not indexed under its hash")
	}
}

func TestApplierSteadyStateDoesNotAllocate(t *testing.T) {
	if hashRaceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	cfg := KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 16}
	hs, _ := NewHasherSet(cfg, nil)
	a, err := NewApplier(ApplierConfig{Index: nopIndex{}, Interner: NewInterner(), Hashers: hs, DigestCacheSize: 1024, AliasCacheSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	toks := seq(1000, 16*8)
	for _, engine := range []KeyConfig{cfg, {Algo: AlgoSHA256, Seed: "1", BlockSize: 16}} {
		eh := engineKeys(t, engine, toks, RequestExtras{LoraName: "x"})
		evs := []Event{stored(eh, toks, 16, 0, 4), stored(eh, toks, 16, 4, 8), {Kind: BlockRemoved, BlockHashes: eh}}
		for i := range evs {
			evs[i].LoraName = "x"
		}
		evs[1].LoraName = ""
		evs[1].ExtraKeys = [][]any{{"x"}, {"x"}, {"x"}, {"x"}} // generic path, same keys
		b := &Batch{Pod: "p-" + engine.Seed, Model: "m", Events: evs}
		a.Apply(context.Background(), b) // warm: pod state, tables, scratch buffers
		if n := testing.AllocsPerRun(50, func() { a.Apply(context.Background(), b) }); n != 0 {
			t.Errorf("seed %s: %v allocs per batch", engine.Seed, n)
		}
	}
}

// A pod that goes quiet after an index error must not wait for its next batch
// to be cleared: Recover clears it once the index answers again, and until
// then Trusted tells the read path to leave it out of scores.
func TestApplierRecoverQuietPod(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	e.apply("q", 0, EngineVLLM, stored(eh, toks, 4, 0, 1))
	id, other := e.podID("p", 0), e.podID("q", 0)

	e.idx.setDown(true)
	e.apply("p", 0, EngineVLLM, stored(eh, toks, 4, 1, 2))
	if e.a.Trusted(id) || !e.a.Trusted(other) {
		t.Fatal("after the failed write p must be untrusted and q trusted")
	}
	if n, err := e.a.Recover(context.Background()); n != 0 || err == nil {
		t.Fatalf("Recover while the index is down = %d, %v; want 0 and an error", n, err)
	}
	if e.a.Trusted(id) {
		t.Fatal("p trusted although its clear failed")
	}

	e.idx.setDown(false)
	calls := len(e.idx.log())
	if n, err := e.a.Recover(context.Background()); n != 1 || err != nil {
		t.Fatalf("Recover after the index is back = %d, %v; want 1, nil", n, err)
	}
	if got := e.idx.log()[calls:]; len(got) != 1 || got[0] != fmt.Sprintf("clear pod=%d", id) {
		t.Fatalf("Recover made calls %v; want exactly one clear of p", got)
	}
	if !e.a.Trusted(id) || e.pod("p", 0).Untrusted || e.idx.count(id) != 0 {
		t.Fatalf("p after recovery: trusted=%v stats=%+v held=%d", e.a.Trusted(id), e.pod("p", 0), e.idx.count(id))
	}
	if e.metric("kvindexd_untrusted_pods") != 0 || e.metric("kvindexd_recovery_clears_total") != 1 {
		t.Fatal("metrics after Recover")
	}
	// nothing left to do: no further index calls
	calls = len(e.idx.log())
	if n, _ := e.a.Recover(context.Background()); n != 0 || len(e.idx.log()) != calls {
		t.Fatal("Recover with no untrusted pod touched the index")
	}
}

// TestApplierRecoverRacesApply: Recover (the daemon's background loop) runs
// while pods apply batches and the index goes down and up under them. Trust
// bookkeeping must stay consistent: once the index is back and Recover has
// run, every pod is trusted, Trusted agrees with PodStats, and the
// untrusted-pods gauge is back to 0 (an Inc without its Dec, or the reverse,
// would leave it off). Run under -race this also checks the locking.
func TestApplierRecoverRacesApply(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 16)
	eh := engineKeys(t, cborSeed0, toks, RequestExtras{})
	ctx := context.Background()
	stop := make(chan struct{})
	started := make(chan struct{})
	recovered := make(chan struct{})
	go func() { // the recovery loop and the read path
		defer close(recovered)
		for i := 0; ; i++ {
			_, _ = e.a.Recover(ctx)
			for p := 0; p < 4; p++ {
				if id, ok := e.in.LookupPod(fmt.Sprintf("pod-%d", p), 0); ok {
					e.a.Trusted(id)
				}
			}
			if i == 0 {
				close(started)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-started
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			name := fmt.Sprintf("pod-%d", p)
			id := e.in.Pod(name, 0)
			for r := 0; r < 50; r++ {
				// every third round the index fails this pod's writes
				e.idx.setPodDown(id, (r+p)%3 == 0)
				e.apply(name, 0, EngineVLLM, stored(eh, toks, 4, 0, 4))
				e.apply(name, 0, EngineVLLM, Event{Kind: BlockRemoved, BlockHashes: eh[2:]})
			}
		}(p)
	}
	wg.Wait()
	close(stop)
	<-recovered

	for p := 0; p < 4; p++ {
		e.idx.setPodDown(e.podID(fmt.Sprintf("pod-%d", p), 0), false)
	}
	if _, err := e.a.Recover(ctx); err != nil {
		t.Fatalf("Recover with the index up: %v", err)
	}
	for _, ps := range e.a.PodStats() {
		id := e.podID(ps.Pod, ps.DPRank)
		if ps.Untrusted || !e.a.Trusted(id) {
			t.Errorf("%s after recovery: untrusted=%v trusted=%v", ps.Pod, ps.Untrusted, e.a.Trusted(id))
		}
		if ps.IndexErrors == 0 {
			t.Errorf("%s never saw an index error: the test did not exercise recovery", ps.Pod)
		}
	}
	if g := e.metric("kvindexd_untrusted_pods"); g != 0 {
		t.Errorf("untrusted_pods gauge = %v after every pod recovered, want 0", g)
	}
}
