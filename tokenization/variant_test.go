package tokenization

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// variantParts are text pieces for the synthetic tokenizers: their added
// tokens (with the whitespace lstrip/rstrip absorb), letters at the
// lowercase edges ('A', 'Z', '[' and '@' around them), Metaspace's '▁',
// digits, punctuation merged with the previous piece, and Unicode that
// normalizers change.
var variantParts = []string{" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000",
	"<s>", "</s>", "<unk>", "[CLS]", "[SEP]", "[UNK]", "[LR]", "[L]", "[R]", "HeLLo", "hello", "word", "words",
	"A", "Z", "AZ", "@Z[", "Zz", "ZZZ", "`a", "▁", "▁▁x", "x▁", "12", "3456", "7",
	"-", "--", "!!", "?", ".", ",", "'s", "don't", "x.y", "Hello", "World", "ab", "abc",
	"é", "e\u0301", "Ⅻ", "ﬁ", "①", "ＡＢ", "日本", "👍🏽"}

// TestVariantSuffixProperty is the continuation property of
// TestEncodeSuffixProperty on the synthetic tokenizers, whose components
// (Prepend/Strip/Replace normalizers, Lowercase, Metaspace prepend schemes,
// Split behaviours such as MergedWithPrevious, lstrip/rstrip added tokens)
// the five real models do not use: for every boundary b of a random text,
// ids[:b.Tokens] + EncodeSuffix(text, b.Offset) == ids, and the suffix's
// own boundaries are the full encoding's after b.
func TestVariantSuffixProperty(t *testing.T) {
	n := 150
	if race.Enabled || testing.Short() {
		n = 40
	}
	for _, v := range variantFixtures {
		raw := strings.NewReplacer(`"normalized":true`, `"normalized":false`, `"single_word":true`, `"single_word":false`).Replace(v.tokenizerJSON)
		forms := map[string]string{v.name: v.tokenizerJSON, v.name + "/raw": raw}
		if seq, ok := digitsBeforeMetaspace(v.tokenizerJSON); ok {
			forms[v.name+"/digits-first"] = seq
		}
		for name, tj := range forms {
			t.Run(name, func(t *testing.T) {
				tk, err := Load([]byte(tj), nil)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(uint64(len(name)), 11))
				checked := 0
				for i := 0; i < n; i++ {
					var b strings.Builder
					for k := rng.IntN(14); k >= 0; k-- {
						b.WriteString(variantParts[rng.IntN(len(variantParts))])
					}
					text := b.String()
					for _, add := range []bool{false, true} {
						ids, bs, err := tk.EncodeBoundaries(text, add)
						if err != nil {
							t.Fatal(err)
						}
						if plain, _ := tk.Encode(text, add); !slices.Equal(plain, ids) {
							t.Fatalf("EncodeBoundaries ids differ from Encode for %q", text)
						}
						for j, bd := range bs {
							if j > 0 && bd.Offset <= bs[j-1].Offset {
								t.Fatalf("%q: boundaries not ascending: %v", text, bs)
							}
							suf, sb, err := tk.EncodeSuffixBoundaries(text, bd.Offset, add)
							if err != nil {
								t.Fatal(err)
							}
							if got := append(slices.Clip(ids[:bd.Tokens]), suf...); !slices.Equal(got, ids) {
								t.Fatalf("add=%v %q at boundary %+v (prefix %q):\n want %v\n got  %v", add, text, bd, text[:bd.Offset], ids[bd.Tokens:], suf)
							}
							var want []Boundary
							for _, x := range bs {
								if x.Offset >= bd.Offset {
									want = append(want, Boundary{x.Offset, x.Tokens - bd.Tokens})
								}
							}
							if !slices.Equal(sb, want) {
								t.Fatalf("add=%v %q from %d:\n suffix boundaries %v\n full after from  %v", add, text, bd.Offset, sb, want)
							}
							checked++
						}
					}
				}
				if checked < n {
					t.Fatalf("only %d boundaries checked", checked)
				}
			})
		}
	}
}

// digitsBeforeMetaspace rewrites a Metaspace pre-tokenizer as a Sequence of
// Digits then that Metaspace, so Metaspace also sees pieces that are not the
// first of their input (its "always" scheme prefixes those too). The
// property needs no reference ids, so a tokenizer no fixture has is fine.
func digitsBeforeMetaspace(tj string) (string, bool) {
	const ms = `"pre_tokenizer":{"type":"Metaspace"`
	i := strings.Index(tj, ms)
	if i < 0 {
		return "", false
	}
	end := i + strings.IndexByte(tj[i+len(ms):], '}') + len(ms) + 1 // the flat Metaspace object ends here
	return tj[:i] + `"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},` +
		tj[i+len(`"pre_tokenizer":`):end] + `]}` + tj[end:], true
}

// Lowercase's ASCII fast path against the unicode package.
func TestLowerOfASCII(t *testing.T) {
	for c := rune(0); c < utf8.RuneSelf; c++ {
		l, changed := lowerOf(c)
		want := unicode.ToLower(c)
		if changed != (want != c) || (changed && l != string(want)) {
			t.Fatalf("lowerOf(%q) = %q %v, want %q", c, l, changed, want)
		}
	}
}
