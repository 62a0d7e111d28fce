package blockkeys

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBlockHashDifferentialOracle hashes pseudo-random requests, drawn to sit
// near the encoders' edges (string lengths around 256 and 64 KiB, every UTF-8
// width, interned 1-char strings, token ids of every opcode width, odd block
// sizes), with every algorithm, and compares with hack/blockhash_oracle.py,
// which runs the reference encoders (CPython pickle, cbor2, msgpack, xxhash).
// The cases are fixed by the seed below, so a failure reproduces. It skips
// when /usr/bin/python3 lacks the reference modules, unless CI=true or
// KVINDEX_REQUIRE_INTEROP is set.
func TestBlockHashDifferentialOracle(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import cbor2, msgpack, xxhash").Run(); err != nil {
		msg := fmt.Sprintf("%s with cbor2, msgpack and xxhash needed (apt-get install python3-cbor2 python3-msgpack python3-xxhash): %v", python, err)
		if os.Getenv("CI") == "true" || os.Getenv("KVINDEX_REQUIRE_INTEROP") != "" {
			t.Fatal(msg)
		}
		fmt.Fprintln(os.Stderr, "!!! SKIPPING "+msg)
		t.Skip(msg)
	}
	type oracleCase struct {
		Algo      HashAlgo `json:"algo"`
		Seed      string   `json:"seed"`
		BlockSize int      `json:"block_size"`
		TokenIDs  []uint32 `json:"token_ids"`
		LoraName  string   `json:"lora_name,omitempty"`
		CacheSalt string   `json:"cache_salt,omitempty"`
	}
	rng := rand.New(rand.NewSource(20261123))
	chars := []string{"a", "Z", "\u00e9", "\u00ff", "\u0100", "\u65e5", "\U0001f600"}
	randString := func() string {
		var n int
		switch rng.Intn(6) {
		case 0:
			return chars[rng.Intn(len(chars))] // 1-char: interned below U+0100
		case 1:
			n = rng.Intn(40)
		case 2:
			n = 250 + rng.Intn(10)
		case 3:
			n = 65536 - 1100 + rng.Intn(1110) // first frame fills up
		case 4:
			n = 65530 + rng.Intn(12)
		default:
			n = 43690 + rng.Intn(200) - 100
		}
		var b strings.Builder
		for b.Len() < n {
			c := chars[rng.Intn(len(chars))]
			if b.Len()+len(c) > n {
				c = "x"
			}
			b.WriteString(c)
		}
		return b.String()
	}
	widths := []uint32{24, 128, 256, 65536, 1 << 31, 0}
	var cases []oracleCase
	var in bytes.Buffer
	for i := 0; i < 400; i++ {
		c := oracleCase{
			Algo: HashAlgos[rng.Intn(len(HashAlgos))],
			Seed: []string{"0", "42", "", "s\u00e4lt"}[rng.Intn(4)],
		}
		c.BlockSize = []int{1, 2, 3, 4, 15, 16, 17, 23, 24, 64, 128, 1 + rng.Intn(300)}[rng.Intn(12)]
		n := c.BlockSize*(1+rng.Intn(3)) + rng.Intn(c.BlockSize)
		c.TokenIDs = make([]uint32, n)
		for j := range c.TokenIDs {
			if w := widths[rng.Intn(len(widths))]; w != 0 {
				c.TokenIDs[j] = uint32(rng.Int63n(int64(w)))
			} else {
				c.TokenIDs[j] = uint32(1<<31 + rng.Int63n(1<<31))
			}
		}
		if rng.Intn(2) == 0 {
			c.LoraName = randString()
		}
		if rng.Intn(2) == 0 {
			c.CacheSalt = randString()
		}
		line, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(append(line, '\n'))
		cases = append(cases, c)
	}
	cmd := exec.Command(python, "../hack/blockhash_oracle.py")
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("oracle: %v: %s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	hashers := map[KeyConfig]*Hasher{}
	i := 0
	for ; sc.Scan(); i++ {
		if i >= len(cases) {
			t.Fatalf("oracle wrote more than %d lines", len(cases))
		}
		var want struct{ Keys []uint64 }
		if err := json.Unmarshal(sc.Bytes(), &want); err != nil {
			t.Fatal(err)
		}
		c := cases[i]
		cfg := KeyConfig{Algo: c.Algo, Seed: c.Seed, BlockSize: c.BlockSize}
		h := hashers[cfg]
		if h == nil {
			if h, err = NewHasher(cfg); err != nil {
				t.Fatal(err)
			}
			hashers[cfg] = h
		}
		got := h.Keys(nil, c.TokenIDs, RequestExtras{LoraName: c.LoraName, CacheSalt: c.CacheSalt})
		if fmt.Sprint(got) != fmt.Sprint(want.Keys) {
			t.Errorf("case %d (%s, block size %d, %d tokens, lora %d bytes, salt %d bytes): keys %v, want %v",
				i, cfg, c.BlockSize, len(c.TokenIDs), len(c.LoraName), len(c.CacheSalt), got, want.Keys)
		}
	}
	if i != len(cases) {
		t.Fatalf("oracle answered %d of %d cases", i, len(cases))
	}
}
