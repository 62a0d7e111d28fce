package tokenization

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// Fixture models. qwen3's files are committed (testdata/qwen3); the others
// are fetched by hack/tokenizers/setup.sh into $KVINDEX_TOKENIZERS_DIR/<model>
// (default <repo>/.cache/tokenizers/<model>).
var encModels = []string{"qwen3", "llama3_1", "deepseek_v3", "gemma3", "llama2"}

func encFixtureDir(model string) string {
	if model == "qwen3" {
		return filepath.Join("testdata", "qwen3")
	}
	base := os.Getenv("KVINDEX_TOKENIZERS_DIR")
	if base == "" {
		base = filepath.Join("..", ".cache", "tokenizers")
	}
	return filepath.Join(base, model)
}

var (
	encTokMu    sync.Mutex
	encTokCache = map[string]*Tokenizer{}
)

// encLoad loads a fixture model once per test binary, skipping (or failing
// with KVINDEX_REQUIRE_ALL_TOKENIZERS=1) when its files were not fetched.
func encLoad(t testing.TB, model string) *Tokenizer {
	t.Helper()
	encTokMu.Lock()
	defer encTokMu.Unlock()
	if tk, ok := encTokCache[model]; ok {
		return tk
	}
	if race.Enabled && model != "qwen3" {
		t.Skip("race build: " + model + " is covered by the non-race run (loading every model under -race is slow)")
	}
	dir := encFixtureDir(model)
	if !HasTokenizerFile(dir) {
		msg := "!!! SKIPPING " + model + ": no tokenizer files in " + dir + " (run hack/tokenizers/setup.sh or make fetch-tokenizers)"
		if os.Getenv("KVINDEX_REQUIRE_ALL_TOKENIZERS") == "1" {
			t.Fatal(msg)
		}
		// t.Skip alone is silent in go test's default output.
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	tj, cj, err := ReadTokenizerFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Load(tj, cj)
	if err != nil {
		t.Fatalf("%s: Load: %v", model, err)
	}
	encTokCache[model] = tk
	return tk
}

type goldenCase struct {
	Text string   `json:"text"`
	Add  bool     `json:"add_special_tokens"`
	IDs  []uint32 `json:"ids"`
}

func readGolden(t testing.TB, model string) []goldenCase {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", model+".jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []goldenCase
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<28)
	for sc.Scan() {
		var c goldenCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s golden line %d: %v", model, len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
