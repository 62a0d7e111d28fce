package blockkeys

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// The vectors in testdata/engine_hash_vectors.json are computed with Python's
// hashlib from each engine's published hashing rules (the script names the
// engine source it follows):
//
//	/usr/bin/python3 hack/gen_engine_hash_vectors.py > blockkeys/testdata/engine_hash_vectors.json
type engineVector struct {
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Keys      []int64  `json:"keys"` // the wire values: signed int64
	CacheSalt string   `json:"cache_salt"`
}

func loadEngineVectors(t *testing.T) map[string][]engineVector {
	t.Helper()
	b, err := os.ReadFile("testdata/engine_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string][]engineVector
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	// SGLang with EAGLE: hack/gen_sglang_eagle_vectors.py, hashlib fed
	// exactly SGLang's get_hash_str calls on its bigram keys.
	if b, err = os.ReadFile("testdata/sglang_eagle_vectors.json"); err != nil {
		t.Fatal(err)
	}
	var eagle map[string][]engineVector
	if err := json.Unmarshal(b, &eagle); err != nil {
		t.Fatal(err)
	}
	v[EngineSGLangEAGLE.String()] = eagle["sglang_eagle"]
	return v
}

// Every engine's hashing reproduces its golden vectors, through Hasher.Keys
// and through the request path's KeyCache (cold, then warm).
func TestEngineHashVectors(t *testing.T) {
	all := loadEngineVectors(t)
	for e := range Engines {
		eng := Engine(e)
		if eng.Info().Scheme == SchemeVLLM {
			continue // vLLM: hash_test.go and hash_edge_test.go
		}
		vs := all[eng.String()]
		if len(vs) == 0 {
			t.Fatalf("no vectors for %s", eng)
		}
		for i, v := range vs {
			set, err := NewHasherSet(KeyConfig{Algo: AlgoSHA256, BlockSize: v.BlockSize}, nil)
			if err != nil {
				t.Fatal(err)
			}
			h := set.ForEngine("any", eng)
			if h.Engine() != eng {
				t.Fatalf("%s: hasher of %s", eng, h.Engine())
			}
			want := make([]Key, len(v.Keys))
			for j, k := range v.Keys {
				want[j] = Key(uint64(k))
			}
			x := RequestExtras{CacheSalt: v.CacheSalt}
			if got := h.Keys(nil, v.Tokens, x); !slices.Equal(got, want) && len(want)+len(got) > 0 {
				t.Fatalf("%s vector %d: keys %x, want %x", eng, i, got, want)
			}
			kc := NewKeyCache(h, 64)
			for pass := 0; pass < 2; pass++ {
				if got := kc.Keys(nil, v.Tokens, x); !slices.Equal(got, want) && len(want)+len(got) > 0 {
					t.Fatalf("%s vector %d pass %d: cached keys %x, want %x", eng, i, pass, got, want)
				}
			}
		}
	}
	// A LoRA is in TensorRT-LLM's root as a numeric task id a router does
	// not know by name: such requests get no TensorRT-LLM keys at all.
	set, _ := NewHasherSet(KeyConfig{Algo: AlgoSHA256, BlockSize: 4}, nil)
	if got := set.ForEngine("", EngineTRTLLM).Keys(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, RequestExtras{LoraName: "sql"}); len(got) != 0 {
		t.Fatalf("TensorRT-LLM keys for a LoRA request: %x", got)
	}
}

// TensorRT-LLM's cache-salt id against a BLAKE3 we did not write (npm
// hash-wasm: hack/blake3/gen-salt-vectors.mjs).
func TestTRTSaltIDVectors(t *testing.T) {
	b, err := os.ReadFile("testdata/trt_salt_ids.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		IDs []struct {
			Salt string `json:"salt"`
			ID   uint64 `json:"salt_id,string"`
		} `json:"trtllm_salt_ids"`
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.IDs) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	for _, c := range v.IDs {
		if got := TRTSaltID(c.Salt); got != c.ID {
			t.Errorf("salt %q: id %d, want %d", c.Salt, got, c.ID)
		}
	}
}
