package prefixstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/tokenization"
)

// Edges of chunking: the split-safety margin, the exact
// LRU order and bound, and whitespace control characters at chunk edges.

// class must put every rune where the package comment says: Unicode
// whitespace, Unicode numbers, everything else. The reference here is the
// unicode package itself, not the ASCII fast path.
func TestClassMatchesUnicode(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := classOther
		switch {
		case unicode.IsSpace(r):
			want = classSpace
		case unicode.IsNumber(r):
			want = classNumber
		}
		if got := class(r); got != want {
			t.Fatalf("class(%U) = %d, want %d", r, got, want)
		}
	}
}

// manyRunsToken is an added token made of many short character-class runs
// (letters, spaces, digits alternate): the run walk-back alone moves only a
// few bytes over it, so only the margin keeps a reused boundary from
// falling inside a token that straddles a chunk edge.
const manyRunsToken = "<x 1 y 2 z 3 w 4 v 5 u 6 t 7 s 8 r 9 q>"

// manyRunsID follows qwen3's last added token (151668).
const manyRunsID = 151669

// withAddedToken writes qwen3's tokenizer files plus manyRunsToken to a
// temporary model directory.
func withAddedToken(t *testing.T) string {
	t.Helper()
	tj, cfg, err := tokenization.ReadTokenizerFiles(modelDir("qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	// append the token to the end of added_tokens (ids follow list order)
	i := bytes.Index(tj, []byte(`"added_tokens"`))
	j := bytes.IndexByte(tj[max(i, 0):], '[')
	if i < 0 || j < 0 {
		t.Fatal("tokenizer.json has no added_tokens list")
	}
	dec := json.NewDecoder(bytes.NewReader(tj[i+j:]))
	var list []json.RawMessage
	if err := dec.Decode(&list); err != nil {
		t.Fatal(err)
	}
	at := i + j + int(dec.InputOffset()) - 1 // the closing ']'
	tok := fmt.Sprintf(`,{"id":%d,"content":%q,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}`, manyRunsID, manyRunsToken)
	out := append(append(append([]byte(nil), tj[:at]...), tok...), tj[at:]...)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The cached prompt stops inside the added token (at every offset, at every
// alignment to the chunk edge); the request completes it. Reusing ids up to
// a boundary inside the token's span would give ids full tokenization never
// produces.
func TestMarginCoversStraddlingAddedToken(t *testing.T) {
	dir := withAddedToken(t)
	reg := tokenization.NewRegistry(tokenization.RegistryConfig{Models: map[string]string{"runs": dir}})
	tok, err := reg.Get("runs")
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := tok.Encode(manyRunsToken, false); len(ids) != 1 || ids[0] != manyRunsID {
		t.Fatalf("the added token does not encode as itself: %v", ids)
	}
	if tok.MaxAddedTokenBytes() != len(manyRunsToken) {
		t.Fatalf("MaxAddedTokenBytes = %d, want %d", tok.MaxAddedTokenBytes(), len(manyRunsToken))
	}
	const chunk = 16
	m := NewMetrics(nil)
	step := 3
	if race.Enabled || testing.Short() {
		step = 11
	}
	base := strings.Repeat("Some words first, then a few more words to fill chunks. ", 4)
	for pad := 0; pad < chunk; pad++ {
		for cut := 1 + pad%step; cut < len(manyRunsToken); cut += step {
			s := New(Config{ChunkBytes: chunk, Capacity: 1024}, reg, m)
			prefix := base + strings.Repeat("a", pad)
			cached := prefix + manyRunsToken[:cut] + strings.Repeat(" tail", 30)
			req := prefix + manyRunsToken + strings.Repeat(" more", 30)
			checkExact(t, s, tok, "runs", cached)
			checkExact(t, s, tok, "runs", req)
		}
	}
	if value(m.hits) == 0 {
		t.Fatal("no request reused cached ids: the test does not exercise the margin")
	}
}

// The LRU list: an insert puts a prompt's chunks most recent first from the
// root down (parents outlive their children), a lookup touches its chain the
// same way, and the store holds exactly Capacity chunks, evicting the least
// recent.
func TestLRUOrderAndExactCapacity(t *testing.T) {
	const c = 4
	ms := newModelStore("m", 5, NewMetrics(nil))
	hashesOf := func(p string) []uint64 {
		h := make([]uint64, len(p)/c)
		for i := range h {
			h[i] = uint64(p[i*c])<<16 | uint64(i) // distinct per chunk in these prompts
		}
		return h
	}
	insert := func(p string) {
		ms.insert(p, c, 0, hashesOf(p), 0, tokenization.Boundary{}, nil, nil)
	}
	order := func() string {
		var b strings.Builder
		for n := ms.lru.next; n != &ms.lru; n = n.next {
			fmt.Fprintf(&b, "%s%d ", n.chunk[:1], n.index)
		}
		return strings.TrimSpace(b.String())
	}
	check := func(what, want string) {
		t.Helper()
		if got := order(); got != want {
			t.Fatalf("%s: LRU (most recent first) %q, want %q", what, got, want)
		}
		if len(ms.nodes) != strings.Count(want, " ")+1 {
			t.Fatalf("%s: %d nodes, list %q", what, len(ms.nodes), want)
		}
	}
	pa := "aaaaAAAAaaaa" // 3 chunks
	pb := "bbbbBBBBbbbb"
	insert(pa)
	check("after a", "a0 A1 a2")
	insert(pb)
	// 6 chunks for capacity 5: a's deepest chunk goes
	check("after b", "b0 B1 b2 a0 A1")
	if ms.evictions != 1 {
		t.Fatalf("evictions = %d", ms.evictions)
	}
	// looking a up touches its chain deepest first: a0 ends most recent
	if matched, _, _ := ms.lookup(pa, c, hashesOf(pa)); matched != 2 {
		t.Fatalf("lookup(a) matched %d chunks, want 2", matched)
	}
	check("after lookup a", "a0 A1 b0 B1 b2")
	pc := "cccc" // one more chunk: b's deepest goes
	insert(pc)
	check("after c", "c0 a0 A1 b0 B1")
	if ms.evictions != 2 {
		t.Fatalf("evictions = %d", ms.evictions)
	}
	// re-inserting a cached chunk only touches it
	insert(pb[:4])
	check("after b0 again", "b0 c0 a0 A1 B1")
}

// Whitespace control characters (\t \n \v \f \r, U+0085) in runs between
// words, the prompt cut at every offset of a stretch and continued
// differently: every alignment of a run to a chunk edge and to the reused
// boundary, and the reused ids must still equal full tokenization.
func TestControlWhitespaceAtChunkEdges(t *testing.T) {
	tok := needModel(t, "qwen3")
	const chunk = 16
	m := NewMetrics(nil)
	runs := []string{"\r\v\f", "\v\v\v\v", "\f\r\n", "\t\v \f", "\u0085\v", "\r\r\r\r\r", " \v", "\f"}
	words := strings.Fields("alpha beta 42 gamma delta 7 epsilon")
	var b strings.Builder
	for i := 0; b.Len() < 400; i++ {
		b.WriteString(words[i%len(words)])
		b.WriteString(runs[i%len(runs)])
	}
	shared := b.String()
	conts := []string{"x tail", "\n\nnext", " \t y", "\v\fz", "12 34"}
	s := New(Config{ChunkBytes: chunk, Capacity: 4096}, registry(), m)
	stretch := 64
	if race.Enabled || testing.Short() {
		stretch = 20
	}
	for cut := len(shared) - stretch; cut <= len(shared); cut++ {
		for _, cont := range conts {
			checkExact(t, s, tok, "qwen3", shared[:cut]+cont+strings.Repeat(" filler words", 3))
		}
	}
	if value(m.hits) < value(m.misses) {
		t.Fatalf("%v hits, %v misses: the cuts do not exercise reuse", value(m.hits), value(m.misses))
	}
}
