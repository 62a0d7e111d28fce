package promises

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/vmihailenco/msgpack/v5"
)

// Issue 32: what the shipped binary predicts for publishers other than a
// vLLM started with PYTHONHASHSEED set.

// podParity is a pod's parity counters from GET /v1/pods.
type podParity struct {
	Pod        string `json:"pod"`
	Matches    uint64 `json:"parity_matches"`
	Mismatches uint64 `json:"parity_mismatches"`
	Unverified uint64 `json:"parity_unverified"`
	Hint       string `json:"parity_hint"`
	Reason     string `json:"unverified_reason"`
}

func parityOf(t *testing.T, d *harness.Daemon, pod string) podParity {
	t.Helper()
	code, body := d.Get("/v1/pods")
	if code != 200 {
		t.Fatalf("/v1/pods: %d %s", code, body)
	}
	var out struct {
		Pods []podParity `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	for _, p := range out.Pods {
		if p.Pod == pod {
			return p
		}
	}
	return podParity{}
}

// testdata reads a golden-vector file of blockkeys/testdata.
func testdata(t *testing.T, name string, v any) {
	t.Helper()
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "blockkeys", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// A vLLM started without PYTHONHASHSEED hashes its sha256 family from the
// seed "vllm-none-hash" (vllm-project/vllm PR #51875): the daemon with its
// default flags computes the same keys. The engine's hashes are the golden
// vector hack/gen_blockhash_vectors.py computed with CPython's pickle and
// hashlib (sha256, seed 'vllm-none-hash', block size 16, tokens 1..56).
func TestPromiseDefaultSeedIsVLLMs(t *testing.T) {
	t.Parallel()
	var vf struct {
		Cases []struct {
			Name string   `json:"name"`
			Keys []uint64 `json:"keys"`
		} `json:"cases"`
	}
	testdata(t, "blockhash_vectors.json", &vf)
	var keys []uint64
	for _, c := range vf.Cases {
		if c.Name == "sha256/seed='vllm-none-hash'/bs=16/chain" {
			keys = c.Keys
		}
	}
	if len(keys) != 3 {
		t.Fatalf("golden vector: %d keys", len(keys))
	}
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	d := harness.Start(t)
	publish(t, d.Publisher(), "unseeded", model, 0, stored(keys, toks))
	wait.Until(t, "unseeded engine scored", func() string {
		if got := d.ScoreTokens(model, toks)["unseeded"]; got != 3 {
			return fmt.Sprintf("scores %d of 3", got)
		}
		return ""
	})
	if p := parityOf(t, d, "unseeded"); p.Matches != 3 || p.Mismatches != 0 || p.Hint != "" {
		t.Fatalf("parity %+v: the default seed is not vLLM's", p)
	}
}

// eagleCase is one case of blockkeys/testdata/sglang_eagle_vectors.json:
// hack/gen_sglang_eagle_vectors.py feeds hashlib SGLang's own get_hash_str
// calls on its EAGLE bigram keys and encodes the KVEventBatch its radix
// cache publishes for the prompt (payload).
type eagleCase struct {
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Keys      []int64  `json:"keys"`
	Payload   string   `json:"payload"`
}

// SGLang with EAGLE publishes each position as the pair [t_i, t_i+1]: the
// payload SGLang sends goes over ZMQ as it is, the daemon checks the pairs
// against SGLang's hashing and scores the prompt's token ids by pair keys:
// floor((n-1)/P) pages.
func TestPromiseSGLangEAGLEPagesScore(t *testing.T) {
	t.Parallel()
	var vf struct {
		Cases []eagleCase `json:"sglang_eagle"`
	}
	testdata(t, "sglang_eagle_vectors.json", &vf)
	var c eagleCase
	for _, v := range vf.Cases {
		if v.BlockSize == 16 && len(v.Keys) == 4 {
			c = v
		}
	}
	if c.Payload == "" || len(c.Tokens) != 65 {
		t.Fatal("no 16-token-page vector of 65 tokens")
	}
	payload, err := hex.DecodeString(c.Payload)
	if err != nil {
		t.Fatal(err)
	}
	d := harness.Start(t, "--bind-engine", "sglang")
	if err := d.Publisher().Publish("kv@eagle@"+model, 0, payload); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "EAGLE pages scored by token ids", func() string {
		if got := d.ScoreTokens(model, c.Tokens)["eagle"]; got != 4 {
			return fmt.Sprintf("scores %d of 4", got)
		}
		return ""
	})
	if p := parityOf(t, d, "eagle"); p.Matches != 4 || p.Mismatches+p.Unverified != 0 {
		t.Fatalf("parity %+v", p)
	}
	// One token short of closing the 4th page's last pair: 3 pages.
	if got := d.ScoreTokens(model, c.Tokens[:64])["eagle"]; got != 3 {
		t.Fatalf("64 tokens score %d pages, want 3", got)
	}
}

// llmdHashes are the block hashes llm-d computes for tokens
// (llm-d/llm-d-kv-cache pkg/kvcache/kvblock/token_processor.go, used by
// llm-d-inference-sim): FNV-64a over the canonical CBOR of [parent, tokens,
// extra]; the chain's root is hash(FNV-64a(seed), nil, model name); a text
// request's extra is nil. The CBOR is written here from RFC 8949 for the
// three shapes it takes: unsigned ints, an array of them, null and a text.
func llmdHashes(seed, modelName string, tokens []uint32, bs int) []uint64 {
	uint := func(b []byte, major byte, v uint64) []byte {
		switch {
		case v < 24:
			return append(b, major|byte(v))
		case v <= 0xff:
			return append(b, major|24, byte(v))
		case v <= 0xffff:
			return binary.BigEndian.AppendUint16(append(b, major|25), uint16(v))
		case v <= 0xffffffff:
			return binary.BigEndian.AppendUint32(append(b, major|26), uint32(v))
		}
		return binary.BigEndian.AppendUint64(append(b, major|27), v)
	}
	fnv64a := func(b []byte) uint64 {
		h := fnv.New64a()
		_, _ = h.Write(b)
		return h.Sum64()
	}
	init := fnv64a([]byte(seed))
	root := []byte{0x83}
	root = uint(root, 0, init)
	root = append(root, 0xf6) // nil tokens
	root = append(uint(root, 0x60, uint64(len(modelName))), modelName...)
	parent := fnv64a(root)
	var out []uint64
	for i := 0; i+bs <= len(tokens); i += bs {
		b := uint([]byte{0x83}, 0, parent)
		b = uint(b, 0x80, uint64(bs))
		for _, t := range tokens[i : i+bs] {
			b = uint(b, 0, uint64(t))
		}
		b = append(b, 0xf6) // extra: nil
		parent = fnv64a(b)
		out = append(out, parent)
	}
	return out
}

// llmdBatch is a KVEventBatch as llm-d-inference-sim writes it
// (pkg/kv-cache/kv_cache_sender.go with vmihailenco/msgpack, structs as
// arrays): [ts, [["BlockStored", hashes, parent, token_ids, block_size,
// lora_id, medium, lora_name, extra_keys]], data_parallel_rank], parent 0
// (kvblock.EmptyBlockHash) for a chain's first block.
func llmdBatch(t *testing.T, hashes []uint64, parent uint64, tokens []uint32, bs int) []byte {
	t.Helper()
	medium := "GPU"
	ev := []any{"BlockStored", hashes, parent, tokens, bs, nil, &medium, nil, nil}
	raw, err := msgpack.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal([]any{1764000000.25, []msgpack.RawMessage{raw}, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// llm-d's publishers send parent 0 for a chain's first block: the daemon
// takes it as "no parent", so a pod publishing llm-d's own hashes (which
// differ from vLLM's: indexed under kvindex's keys, aliased) scores by token
// ids, its first request and the one continuing it, and no block is left
// parent_unknown; the hint names llm-d's hash function. Its sequence numbers
// start at 1 as the simulator's do.
func TestPromiseParentZeroIsNoParent(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(77, 4)
	hs := llmdHashes("", model, toks, blockSize)
	if err := pub.Publish("kv@sim@"+model, 1, llmdBatch(t, hs[:2], 0, toks[:2*blockSize], blockSize)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("kv@sim@"+model, 2, llmdBatch(t, hs[2:], hs[1], toks[2*blockSize:], blockSize)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "llm-d pod scored by token ids", func() string {
		if got := d.ScoreTokens(model, toks)["sim"]; got != 4 {
			return fmt.Sprintf("scores %d of 4", got)
		}
		return ""
	})
	if p := parityOf(t, d, "sim"); p.Unverified != 0 || p.Mismatches != 4 || !strings.HasPrefix(p.Hint, "hash function: the engine publishes llm-d's") {
		t.Fatalf("parity %+v: want its 4 blocks checked, differing, and the hint naming llm-d's hash function", p)
	}
}

// llm-d's publishers number batches from 1. With --bind-first-seq 1 a stream
// whose first batch is 1 is complete from its start; with the default (the
// engines count from 0) the same stream reads as joined late by one batch.
func TestPromiseBindFirstSeq(t *testing.T) {
	t.Parallel()
	toks := prompt(78, 2)
	hs := llmdHashes("", model, toks, blockSize)
	for _, c := range []struct {
		flags    []string
		complete bool
		reason   string
	}{{[]string{"--bind-first-seq", "1"}, true, ""}, {nil, false, "joined_late"}} {
		d := harness.Start(t, c.flags...)
		if err := d.Publisher().Publish("kv@sim@"+model, 1, llmdBatch(t, hs, 0, toks, blockSize)); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, "llm-d pod listed", func() string {
			p, ok := d.Pod("sim")
			if !ok || p.EventsApplied == 0 {
				return "not applied yet"
			}
			if p.Complete != c.complete || p.Reason != c.reason {
				return fmt.Sprintf("flags %v: complete %v reason %q, want %v %q", c.flags, p.Complete, p.Reason, c.complete, c.reason)
			}
			return ""
		})
	}
}
