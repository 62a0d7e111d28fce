package blockkeys

import (
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// The vectors in testdata/blockhash_edge_vectors.json.gz sit on every place
// where one of the encoders changes what it writes: CPython's pickle frames
// (a LoRA name, cache_salt or token tuple that fills a 64 KiB frame, strings
// written outside frames), memo references past index 255, short vs long
// string opcodes, CBOR and msgpack heads for strings, bytes, arrays and ints.
// They come from CPython's C pickle, cbor2, msgpack, hashlib and python-xxhash
// (Debian packages), driven by hack/gen_blockhash_edge_vectors.py, which
// reuses the vLLM glue of hack/gen_blockhash_vectors.py. Regenerate with:
//
//	/usr/bin/python3 hack/gen_blockhash_edge_vectors.py | gzip -9n > blockkeys/testdata/blockhash_edge_vectors.json.gz
type edgeFile struct {
	Generator string `json:"generator"`
	Reference string `json:"reference"`
	NoneHash  []struct {
		Algo     HashAlgo `json:"algo"`
		Seed     string   `json:"seed"`
		NoneHash string   `json:"none_hash"`
	} `json:"none_hashes"`
	Cases   []edgeCase   `json:"cases"`
	Generic []genericVec `json:"generic_extra_keys"`
}

// strSpec is a string stored as pieces repeated: [[piece, count], ...].
type strSpec [][2]json.RawMessage

func (s strSpec) str() (string, error) {
	var b strings.Builder
	for _, pc := range s {
		var piece string
		var n int
		if json.Unmarshal(pc[0], &piece) != nil || json.Unmarshal(pc[1], &n) != nil || n < 0 {
			return "", fmt.Errorf("bad string piece %s x %s", pc[0], pc[1])
		}
		b.WriteString(strings.Repeat(piece, n))
	}
	return b.String(), nil
}

type edgeCase struct {
	Name      string    `json:"name"`
	Algo      HashAlgo  `json:"algo"`
	Seed      string    `json:"seed"`
	BlockSize int       `json:"block_size"`
	TokenIDs  []uint32  `json:"token_ids"`
	TokenGen  *tokenGen `json:"token_gen"`
	Lora      strSpec   `json:"lora"`
	Salt      strSpec   `json:"salt"`
	Keys      []uint64  `json:"keys"`
}

func loadEdgeVectors(t testing.TB) *edgeFile {
	t.Helper()
	f, err := os.Open("testdata/blockhash_edge_vectors.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var ef edgeFile
	if err := json.NewDecoder(zr).Decode(&ef); err != nil {
		t.Fatal(err)
	}
	if len(ef.Cases) == 0 || len(ef.Generic) == 0 || len(ef.NoneHash) == 0 {
		t.Fatal("empty edge vector file")
	}
	return &ef
}

func TestBlockHashEdgeVectors(t *testing.T) {
	ef := loadEdgeVectors(t)
	t.Logf("vectors from %s: %s", ef.Generator, ef.Reference)
	hashers := map[KeyConfig]*Hasher{}
	hasher := func(algo HashAlgo, seed string, bs int) *Hasher {
		cfg := KeyConfig{Algo: algo, Seed: seed, BlockSize: bs}
		if h := hashers[cfg]; h != nil {
			return h
		}
		h, err := NewHasher(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hashers[cfg] = h
		return h
	}
	for _, n := range ef.NoneHash {
		if got := hex.EncodeToString(hasher(n.Algo, n.Seed, 1).NoneHash()); got != n.NoneHash {
			t.Errorf("%s seed %q: NONE_HASH %s, want %s", n.Algo, n.Seed, got, n.NoneHash)
		}
	}
	perAlgo := map[HashAlgo]int{}
	failed := 0
	var keys []Key
	for i := range ef.Cases {
		c := &ef.Cases[i]
		vc := vectorCase{TokenIDs: c.TokenIDs, TokenGen: c.TokenGen}
		lora, err := c.Lora.str()
		if err != nil {
			t.Fatal(err)
		}
		salt, err := c.Salt.str()
		if err != nil {
			t.Fatal(err)
		}
		ex := RequestExtras{LoraName: lora, CacheSalt: salt}
		keys = hasher(c.Algo, c.Seed, c.BlockSize).Keys(keys[:0], vc.tokens(), ex)
		ok := len(keys) == len(c.Keys)
		for j := 0; ok && j < len(keys); j++ {
			ok = uint64(keys[j]) == c.Keys[j]
		}
		if !ok {
			if failed++; failed <= 20 {
				t.Errorf("%s: keys %v, want %v", c.Name, keys, c.Keys)
			}
		}
		perAlgo[c.Algo]++
	}
	if failed > 20 {
		t.Errorf("... %d of %d cases wrong in all", failed, len(ef.Cases))
	}
	for _, a := range HashAlgos {
		if perAlgo[a] < 50 {
			t.Errorf("only %d edge cases for %s", perAlgo[a], a)
		}
	}
}

func TestBlockHashEdgeGenericVectors(t *testing.T) {
	ef := loadEdgeVectors(t)
	perAlgo := map[HashAlgo]int{}
	for i, v := range ef.Generic {
		checkGenericVector(t, i, &v)
		perAlgo[v.Algo]++
	}
	for _, a := range HashAlgos {
		if perAlgo[a] < 20 {
			t.Errorf("only %d generic edge vectors for %s", perAlgo[a], a)
		}
	}
}

// The largest block size is accepted, one more is not: the bound is
// inclusive, as its error message says.
func TestNewHasherBlockSizeBounds(t *testing.T) {
	for _, c := range []struct {
		size int
		ok   bool
	}{{0, false}, {1, true}, {MaxBlockSize, true}, {MaxBlockSize + 1, false}} {
		_, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: c.size})
		if (err == nil) != c.ok {
			t.Errorf("block size %d: err = %v, want ok=%v", c.size, err, c.ok)
		}
	}
}
