package applier

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

func TestApplierParityMatch(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(100, 24) // 6 blocks
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p1", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("p1", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 2, 5), stored(eh, toks, 4, 5, 6))
	p := e.pod("p1", 0)
	if p.ParityMatches != 6 || p.ParityMismatches != 0 || p.ParityUnverified != 0 || p.ParityHint != "" {
		t.Fatalf("parity %+v", p)
	}
	if p.EventsApplied != 3 || p.BlocksStored != 6 || p.Model != testModel || p.Engine != blockkeys.EngineVLLM || p.LastEvent.IsZero() {
		t.Fatalf("stats %+v", p)
	}
	id := e.podID("p1", 0)
	for _, k := range eh {
		if !e.idx.has(id, blockkeys.Key(k)) {
			t.Fatalf("key %d not indexed", k)
		}
	}
	e.apply("p1", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[4:]})
	if e.idx.count(id) != 4 || e.idx.has(id, blockkeys.Key(eh[5])) {
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
	eh := engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{})
	ours := ourKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p1", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("p1", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 2, 4)) // parent known via the digest cache
	p := e.pod("p1", 0)
	if p.ParityMismatches != 4 || p.ParityMatches != 0 || p.ParityUnverified != 0 {
		t.Fatalf("parity %+v", p)
	}
	if !strings.HasPrefix(p.ParityHint, "seed:") {
		t.Fatalf("hint %q", p.ParityHint)
	}
	id := e.podID("p1", 0)
	for i, k := range ours {
		if !e.idx.has(id, k) || e.idx.has(id, blockkeys.Key(eh[i])) {
			t.Fatalf("block %d: own key not indexed or engine hash indexed", i)
		}
	}
	e.apply("p1", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{eh[3], eh[1]}})
	if e.idx.has(id, ours[3]) || e.idx.has(id, ours[1]) || !e.idx.has(id, ours[0]) || !e.idx.has(id, ours[2]) {
		t.Fatal("dual-key removal removed the wrong blocks")
	}
	if got := e.metric("kvindexd_unresolved_removals_total"); got != 0 {
		t.Errorf("unresolved %v", got)
	}
	e.apply("p1", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{12345}})
	if got := e.metric("kvindexd_unresolved_removals_total"); got != 1 {
		t.Errorf("unresolved after unknown hash: %v", got)
	}
	if n := strings.Count(e.logs.String(), "parity mismatch"); n != 1 {
		t.Errorf("hint logged %d times:\n%s", n, e.logs.String())
	}
}

func TestApplierParityHintAlgorithm(t *testing.T) {
	for _, algo := range []blockkeys.HashAlgo{blockkeys.AlgoSHA256, blockkeys.AlgoXXHash, blockkeys.AlgoXXHashCBOR} {
		e := newApplierEnv(t, cborSeed0)
		engineCfg := cborSeed0
		engineCfg.Algo = algo
		toks := seq(1, 8)
		eh := engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{LoraName: "ad"})
		ev := stored(eh, toks, 4, 0, 2)
		ev.LoraName = "ad"
		e.apply("p", 0, blockkeys.EngineVLLM, ev)
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
	eh := engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 8, 0, 2))
	p := e.pod("p", 0)
	if !strings.HasPrefix(p.ParityHint, "block size:") || p.ParityMismatches != 2 || p.ParityUnverified != 0 {
		t.Fatalf("%+v", p)
	}
	// nothing better to index than what the engine says
	if !e.idx.has(e.podID("p", 0), blockkeys.Key(eh[1])) {
		t.Fatal("engine hash not indexed")
	}
}

func TestApplierParityUnverified(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(50, 16)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	// parent never seen: cannot check, indexed as the engine says
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 2, 4))
	// CPU offload style: no token ids, block_size 0
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockStored, BlockHashes: eh[:2], Medium: event.TierCPU})
	// LoRA id without name or extra_keys: the extra keys are unknown
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockStored, BlockHashes: eh[:1], TokenIDs: toks[:4], BlockSize: 4, LoraID: 3, HasLoraID: true})
	p := e.pod("p", 0)
	if p.ParityUnverified != 5 || p.ParityMatches != 0 || p.ParityMismatches != 0 || p.ParityHint != "" {
		t.Fatalf("%+v", p)
	}
	id := e.podID("p", 0)
	for _, k := range eh {
		if !e.idx.has(id, blockkeys.Key(k)) {
			t.Fatalf("engine hash %d not indexed", k)
		}
	}
	// the chain resumes once the parent is known: block 0 verified, then 1..3
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1), stored(eh, toks, 4, 1, 4))
	if p := e.pod("p", 0); p.ParityMatches != 4 {
		t.Fatalf("%+v", p)
	}
}

// Extra keys: generic per-block extra_keys from the event take precedence,
// else lora_name; vLLM's cache_salt only reaches us through extra_keys.
func TestApplierExtraKeys(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(9, 12)
	x := blockkeys.RequestExtras{LoraName: "lora-a", CacheSalt: "salt"}
	eh := engineKeys(t, cborSeed0, toks, x)
	ev := stored(eh, toks, 4, 0, 3)
	ev.LoraName = "lora-a" // ignored: extra_keys present
	ev.ExtraKeys = [][]any{{"lora-a", "salt"}, {"lora-a"}, {"lora-a"}}
	e.apply("p", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 3 {
		t.Fatalf("extra_keys: %+v", p)
	}
	eh2 := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{LoraName: "lora-b"})
	ev = stored(eh2, toks, 4, 0, 3)
	ev.LoraName = "lora-b"
	e.apply("q", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("q", 0); p.ParityMatches != 3 {
		t.Fatalf("lora_name: %+v", p)
	}
	// an extra-key value we cannot serialise: unverified, not an error
	ev = stored(eh, toks, 4, 0, 1)
	ev.ExtraKeys = [][]any{{1.5}}
	e.apply("r", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("r", 0); p.ParityUnverified != 1 || p.IndexErrors != 0 {
		t.Fatalf("float extra key: %+v", p)
	}
}

// SGLang pods are checked against SGLang's own hashing: their blocks are
// indexed under SGLang's page hashes (a salt does not enter them), blocks
// without token ids under the hash they carry, and a pod whose hashes differ
// (a fork seeding its root) under our SGLang keys, aliased, with a hint.
func TestApplierSGLang(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(300, 12)
	sg := sglangKeys(t, toks, 4)
	ev := event.Event{Kind: event.BlockStored, BlockHashes: u64s(sg[:2]), TokenIDs: toks[:8], BlockSize: 4, CacheSalt: "tenant"}
	ev2 := event.Event{Kind: event.BlockStored, BlockHashes: u64s(sg[2:]), ParentHash: uint64(sg[1]), HasParent: true, TokenIDs: toks[8:], BlockSize: 4}
	e.apply("s", 0, blockkeys.EngineSGLang, ev, ev2)
	id := e.podID("s", 0)
	for i, k := range sg {
		if !e.idx.has(id, k) {
			t.Fatalf("SGLang key %d missing", i)
		}
	}
	p := e.pod("s", 0)
	if p.ParityMatches != 3 || p.ParityMismatches != 0 || p.Engine != blockkeys.EngineSGLang {
		t.Fatalf("%+v", p)
	}
	// no token ids: indexed under its hash, unverified
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockStored, BlockHashes: []uint64{77}})
	if e.idx.count(id) != 4 || !e.idx.has(id, 77) || e.pod("s", 0).ParityUnverified != 1 {
		t.Fatal("SGLang block without tokens")
	}
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{uint64(sg[2]), 99}})
	if e.idx.has(id, sg[2]) || e.idx.count(id) != 3 {
		t.Fatal("SGLang removal")
	}
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.AllBlocksCleared})
	if e.idx.count(id) != 0 || e.pod("s", 0).Clears != 1 {
		t.Fatal("AllBlocksCleared")
	}

	// A fork whose hashes differ: our keys, aliased, and a hint.
	fork := []uint64{0xfffffffffffffff1, 42, 0x8000000000000003}
	e.apply("f", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockStored, BlockHashes: fork, TokenIDs: toks, BlockSize: 4})
	fid := e.podID("f", 0)
	for i, k := range sg {
		if !e.idx.has(fid, k) {
			t.Fatalf("fork: our key %d missing", i)
		}
	}
	if p := e.pod("f", 0); p.ParityMismatches != 3 || !strings.Contains(p.ParityHint, "sglang") {
		t.Fatalf("fork %+v", p)
	}
	e.apply("f", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockRemoved, BlockHashes: fork[2:]})
	if e.idx.has(fid, sg[2]) {
		t.Fatal("fork removal not translated")
	}
}

// A pod whose other blocks match but whose salted request's blocks differ
// (vLLM without extra_keys does not publish cache_salt): its configuration is
// right, so its own hashes are indexed and the hint names extra keys.
func TestApplierPartialMismatchExtraKeys(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	plain := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	salted := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{CacheSalt: "tenant"})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(plain, toks, 4, 0, 2))
	e.apply("p", 0, blockkeys.EngineVLLM, stored(salted, toks, 4, 0, 2))
	p := e.pod("p", 0)
	if p.ParityMatches != 2 || p.ParityMismatches != 2 || !strings.HasPrefix(p.ParityHint, "extra keys:") {
		t.Fatalf("%+v", p)
	}
	id := e.podID("p", 0)
	for _, k := range append(plain, salted...) {
		if !e.idx.has(id, blockkeys.Key(k)) {
			t.Fatalf("engine hash %d not indexed", k)
		}
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: salted})
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
	e.apply("p", 0, blockkeys.EngineVLLM, stored(engineKeys(t, wrong, toks, blockkeys.RequestExtras{}), toks, 4, 0, 2))
	if e.pod("p", 0).ParityHint == "" {
		t.Fatal("no hint")
	}
	right := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared}, stored(right, toks, 4, 0, 2))
	p := e.pod("p", 0)
	if p.ParityHint != "" || p.ParityMatches != 2 || p.Clears != 1 {
		t.Fatalf("%+v", p)
	}
	if !e.idx.has(e.podID("p", 0), blockkeys.Key(right[1])) {
		t.Fatal("matching block not indexed under its hash")
	}
}
