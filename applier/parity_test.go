package applier

import (
	"encoding/json"
	"fmt"
	"os"
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

// Issue 32: an engine started without PYTHONHASHSEED (vLLM since PR #51875:
// seed "vllm-none-hash" for the sha256 family) against a kvindex told
// --hash-seed 0, and the reverse: the hint names the seed the engine uses
// and the setting to change, not just "seed".
func TestApplierParityHintNamesSeed(t *testing.T) {
	for _, c := range []struct{ ours, engine, want string }{
		{"0", blockkeys.DefaultSeed, `seed "vllm-none-hash" (vLLM's default with PYTHONHASHSEED unset`},
		{blockkeys.DefaultSeed, "0", `seed "0" (PYTHONHASHSEED="0")`},
		{blockkeys.DefaultSeed, "", `seed "" (PYTHONHASHSEED="")`},
	} {
		ours := cborSeed0
		ours.Seed = c.ours
		e := newApplierEnv(t, ours)
		engineCfg := ours
		engineCfg.Seed = c.engine
		toks := seq(3, 8)
		e.apply("p", 0, blockkeys.EngineVLLM, stored(engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{}), toks, 4, 0, 2))
		p := e.pod("p", 0)
		if !strings.HasPrefix(p.ParityHint, "seed: the engine hashes with "+c.want) ||
			!strings.Contains(p.ParityHint, fmt.Sprintf("set --hash-seed %q", c.engine)) {
			t.Errorf("ours %q engine %q: hint %q", c.ours, c.engine, p.ParityHint)
		}
	}
	// A seed nobody guesses: the hint says which settings to align.
	e := newApplierEnv(t, cborSeed0)
	engineCfg := cborSeed0
	engineCfg.Seed = "31337"
	toks := seq(3, 8)
	e.apply("p", 0, blockkeys.EngineVLLM, stored(engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{}), toks, 4, 0, 2))
	if h := e.pod("p", 0).ParityHint; !strings.Contains(h, "set PYTHONHASHSEED on the engine and kvindex's --hash-seed") {
		t.Errorf("unknown seed: hint %q", h)
	}
}

// eagleVector is one case of blockkeys/testdata/sglang_eagle_vectors.json
// (hack/gen_sglang_eagle_vectors.py: hashlib fed SGLang's get_hash_str calls
// on its EAGLE bigram keys).
type eagleVector struct {
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Keys      []int64  `json:"keys"`
}

func loadEagleVectors(t *testing.T) []eagleVector {
	t.Helper()
	b, err := os.ReadFile("../blockkeys/testdata/sglang_eagle_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Cases []eagleVector `json:"sglang_eagle"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v.Cases
}

// Issue 32: SGLang with EAGLE publishes each position as the pair [t_i,
// t_i+1], one BlockStored per page. Both tokens of every pair are checked
// against SGLang's hash of the pairs, the pages are indexed under those
// hashes, and the applier reports sglang-eagle as applied, so requests are
// also scored by pair keys. Pairs that do not chain are no prompt's pages:
// indexed under their hashes, unverified ("bigram").
func TestApplierSGLangEAGLEPairs(t *testing.T) {
	for _, v := range loadEagleVectors(t) {
		if len(v.Keys) < 2 {
			continue
		}
		bs := v.BlockSize
		e := newApplierEnv(t, blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, BlockSize: bs})
		var evs []event.Event
		for k, h := range v.Keys {
			ev := event.Event{Kind: event.BlockStored, BlockHashes: []uint64{uint64(h)}, BlockSize: bs, Bigram: true}
			for i := k * bs; i < (k+1)*bs; i++ {
				ev.TokenIDs = append(ev.TokenIDs, v.Tokens[i], v.Tokens[i+1])
			}
			if k > 0 {
				ev.ParentHash, ev.HasParent = uint64(v.Keys[k-1]), true
			}
			evs = append(evs, ev)
		}
		e.apply("s", 0, blockkeys.EngineSGLang, evs...)
		p := e.pod("s", 0)
		if p.ParityMatches != uint64(len(v.Keys)) || p.ParityMismatches+p.ParityUnverified != 0 {
			t.Fatalf("page size %d: %+v", bs, p)
		}
		id := e.podID("s", 0)
		for k, h := range v.Keys {
			if !e.idx.has(id, blockkeys.Key(uint64(h))) {
				t.Fatalf("page size %d: page %d not indexed", bs, k)
			}
		}
		if e.a.Engines()&(1<<blockkeys.EngineSGLangEAGLE) == 0 {
			t.Fatalf("page size %d: sglang-eagle not reported as applied", bs)
		}
		// Pick holds the pod's speculative entries under the pair keys.
		if eng, ok := e.a.PodEngine(id); !ok || eng != blockkeys.EngineSGLangEAGLE {
			t.Fatalf("page size %d: pod engine %v %v, want sglang-eagle", bs, eng, ok)
		}
		if bs < 2 {
			continue // one pair per page: nothing to chain within an event
		}
		// The same page with one pair broken: not a prompt's bigrams.
		bad := evs[0]
		bad.TokenIDs = append([]uint32(nil), bad.TokenIDs...)
		bad.TokenIDs[1]++
		e.apply("b", 0, blockkeys.EngineSGLang, bad)
		if p := e.pod("b", 0); p.ParityUnverified != 1 || p.UnverifiedReason != "bigram" || !e.idx.has(e.podID("b", 0), blockkeys.Key(uint64(v.Keys[0]))) {
			t.Fatalf("page size %d: broken pairs %+v", bs, p)
		}
	}
	// Pairs from vLLM (whose hashing has none): unverified, no EAGLE bit.
	e := newApplierEnv(t, blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, BlockSize: 2})
	e.apply("v", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockStored, BlockHashes: []uint64{5}, BlockSize: 2,
		Bigram: true, TokenIDs: []uint32{1, 2, 2, 3}})
	if p := e.pod("v", 0); p.UnverifiedReason != "bigram" || e.a.Engines()&(1<<blockkeys.EngineSGLangEAGLE) != 0 {
		t.Fatalf("vLLM pairs: %+v", p)
	}
	if eng, ok := e.a.PodEngine(e.podID("v", 0)); !ok || eng != blockkeys.EngineVLLM {
		t.Fatalf("vLLM pairs: pod engine %v %v, want vllm", eng, ok)
	}
	if _, ok := e.a.PodEngine(e.podID("v", 0) + 1); ok {
		t.Fatal("a pod that never published has an engine")
	}
}

// Issue 32: llm-d's publishers send llm-d's own block hashes (FNV-64a over
// CBOR, blockkeys.LLMDBlockHash): the hint says the hash function differs,
// not the seed, and the blocks are indexed under kvindex's keys.
func TestApplierParityHintLLMD(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(5, 8)
	p1 := blockkeys.LLMDBlockHash(blockkeys.LLMDRoot("", "m"), toks[:4])
	p2 := blockkeys.LLMDBlockHash(p1, toks[4:])
	e.apply("sim", 0, blockkeys.EngineVLLM, stored([]uint64{p1, p2}, toks, 4, 0, 2))
	p := e.pod("sim", 0)
	if !strings.HasPrefix(p.ParityHint, "hash function: the engine publishes llm-d's block hashes") ||
		!strings.Contains(p.ParityHint, `seed "", model "m"`) || p.ParityMismatches != 2 {
		t.Fatalf("%+v", p)
	}
	for i, k := range ourKeys(t, cborSeed0, toks, blockkeys.RequestExtras{}) {
		if !e.idx.has(e.podID("sim", 0), k) {
			t.Fatalf("block %d not under kvindex's key", i)
		}
	}
}
