package tokenization

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// fastAlphabet covers every class the fast matchers distinguish: ASCII and
// non-ASCII letters (incl. Unicode 16 additions), numbers, all kinds of
// whitespace, \r \n, apostrophes and contraction letters, punctuation,
// symbols, marks, emoji and invalid UTF-8.
var fastAlphabet = []string{
	"a", "Z", "s", "S", "t", "r", "e", "E", "v", "m", "d", "l", "L", "'", "'", "'",
	"é", "ß", "中", "ア", "ﬁ", "\U00013588", "\u1c89", "ǅ", "ʰ",
	"0", "9", "٣", "①", "¼", "²", "Ⅻ", "\U00010D40",
	" ", " ", " ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2003", "\u3000", "\u0085", "\v", "\f", "\u2028",
	"!", ".", ",", "(", ")", "-", "_", "\"", "$", "€", "😀", "👩\u200d💻", "\u0301", "\u200d", "\xff", "\xe2\x82",
	"一", "龥", "ぁ", "ヿ", "\u309f", "\u30a0", "+", "[", "]", "\\", "`", "~", "^", "|", "©", "\u0903", "\u20dd", "\U00010D69",
}

var fastPatterns = []string{qwen2Pattern, llama3Pattern, gpt2Pattern, digits3Pattern, cjkRunPattern, deepseekPattern}

func randomPatternText(rng *rand.Rand) string {
	var b strings.Builder
	n := 1 + rng.IntN(40)
	for i := 0; i < n; i++ {
		b.WriteString(fastAlphabet[rng.IntN(len(fastAlphabet))])
	}
	return b.String()
}

func checkFastEqual(t testing.TB, fast, ref matcher, s string) {
	a, err1 := fast.findAll(s, nil)
	b, err2 := ref.findAll(s, nil)
	if err1 != nil || err2 != nil {
		t.Fatalf("%q: %v %v", s, err1, err2)
	}
	if !slices.Equal(a, b) {
		t.Fatalf("%q:\n fast %v\n re2  %v", s, a, b)
	}
}

func TestFastMatchersEqualRegexp2(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 43))
	var corpus []string
	for _, c := range readGolden(t, "qwen3") {
		if !c.Add {
			corpus = append(corpus, c.Text)
		}
	}
	for _, c := range readGolden(t, "deepseek_v3") {
		if !c.Add && len(c.Text) < 5000 {
			corpus = append(corpus, c.Text)
		}
	}
	for _, p := range fastPatterns {
		fast := fastMatcherFor(p)
		ref, err := newRegexp2Matcher(p)
		if err != nil {
			t.Fatal(err)
		}
		n := 20000
		if race.Enabled {
			n = 2000
		}
		for i := 0; i < n; i++ {
			checkFastEqual(t, fast, ref, randomPatternText(rng))
		}
		if race.Enabled {
			continue // the corpus (100k-character texts through regexp2) runs without -race
		}
		for _, s := range corpus {
			checkFastEqual(t, fast, ref, s)
		}
	}
}

func FuzzFastMatchers(f *testing.F) {
	for _, s := range []string{"it's", "  \n x", "a1234b", "\r\n\r\n  ", "'LL'S", " !!\n\n", "é😀"} {
		f.Add(s)
	}
	pats := fastPatterns
	var refs []matcher
	for _, p := range pats {
		r, err := newRegexp2Matcher(p)
		if err != nil {
			f.Fatal(err)
		}
		refs = append(refs, r)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, p := range pats {
			checkFastEqual(t, fastMatcherFor(p), refs[i], s)
		}
	})
}

func TestIsLocalPattern(t *testing.T) {
	for p, want := range map[string]bool{
		gpt2Pattern:                      true,
		qwen2Pattern:                     true, // [^\r\n\p{L}\p{N}] negates a class: no anchor
		deepseekPattern:                  true, // ^ inside a class is a literal
		`[^\s]+|\s+`:                     true,
		`[]^]+`:                          true, // leading ] is literal, ^ inside the class
		`[\b]x`:                          true, // backspace, not a word boundary
		`\\b`:                            true, // an escaped backslash, then a letter
		`(?<name>x)`:                     true, // a named group, not a look-behind
		`^\s+`:                           false,
		`\s+$`:                           false,
		`[^x]+^`:                         false,
		`x\b`:                            false,
		`\Ax`:                            false,
		`(?<=a)b`:                        false,
		`(?<!a)b`:                        false,
		`[a]\z`:                          false,
		`\p{L}+|[^\s\p{L}]+(?<=[^\s])\s`: false,
	} {
		if got := isLocalPattern(p); got != want {
			t.Errorf("isLocalPattern(%q) = %v, want %v", p, got, want)
		}
	}
}

// A pre-tokenizer regex without a hand-written matcher goes through regexp2;
// [^...] in it used to be taken for an anchor, which left such models with no
// boundaries (and the prefix store with nothing to reuse). qwen3 with its Split
// pattern wrapped in a no-op group must behave exactly like qwen3: the same ids
// and the same boundaries, and the EncodeSuffix property holds.
func TestRegexp2FallbackBoundaries(t *testing.T) {
	if race.Enabled {
		t.Skip("race build: loading qwen3 again is slow; covered by the non-race run")
	}
	tj, cj, err := ReadTokenizerFiles(encFixtureDir("qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string) []byte {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wrapped := "(?:" + qwen2Pattern + ")"
	if fastMatcherFor(wrapped) != nil {
		t.Fatal("the wrapped pattern has a fast matcher: the test would not exercise regexp2")
	}
	vj := bytes.Replace(tj, enc(qwen2Pattern), enc(wrapped), 1)
	if bytes.Equal(vj, tj) {
		t.Fatal("qwen3 tokenizer.json does not contain the qwen2 pattern")
	}
	slow, err := Load(vj, cj)
	if err != nil {
		t.Fatal(err)
	}
	fast := encLoad(t, "qwen3")
	rng := rand.New(rand.NewPCG(5, 6))
	var texts []string
	for i, c := range readGolden(t, "qwen3") {
		if !c.Add && len(c.Text) < 4096 && i%5 == 0 {
			texts = append(texts, c.Text)
		}
	}
	for i := 0; i < 20; i++ {
		texts = append(texts, mixedText(rng, 300+rng.IntN(600)))
	}
	inner := 0
	for _, text := range texts {
		wantIDs, wantB, err := fast.EncodeBoundaries(text, true)
		if err != nil {
			t.Fatal(err)
		}
		ids, bs, err := slow.EncodeBoundaries(text, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, wantIDs) || !slices.Equal(bs, wantB) {
			t.Fatalf("%q: regexp2 path differs from the fast matcher:\n ids %v\n want %v\n boundaries %v\n want %v",
				clip(text, 200), clipIDs(ids), clipIDs(wantIDs), bs, wantB)
		}
		for _, b := range bs {
			if b.Offset == len(text) {
				continue
			}
			inner++
			suf, err := slow.EncodeSuffix(text, b.Offset, true)
			if err != nil {
				t.Fatal(err)
			}
			if got := append(slices.Clip(ids[:b.Tokens]), suf...); !slices.Equal(got, ids) {
				t.Fatalf("%q boundary %+v: suffix %v, want %v", clip(text, 200), b, clipIDs(suf), clipIDs(ids[b.Tokens:]))
			}
		}
	}
	if inner < 10*len(texts) {
		t.Fatalf("only %d inner boundaries in %d texts", inner, len(texts))
	}
}
