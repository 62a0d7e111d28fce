package tokenization

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// boundaryTexts are golden texts (from the reference fixtures) plus
// generated texts mixing prose, code, CJK, specials and whitespace runs.
func boundaryTexts(t *testing.T, model string, n int) []string {
	var out []string
	for i, c := range readGolden(t, model) {
		if !c.Add && len(c.Text) < 4096 && i%3 == 0 {
			out = append(out, c.Text)
		}
	}
	rng := rand.New(rand.NewPCG(7, uint64(len(model))))
	for i := 0; i < n; i++ {
		out = append(out, mixedText(rng, 200+rng.IntN(800)))
	}
	return out
}

// TestEncodeSuffixProperty: for every boundary b of Encode(text),
// ids[:b.Tokens] + EncodeSuffix(text, b.Offset) == ids, on all fixture models.
func TestEncodeSuffixProperty(t *testing.T) {
	for _, model := range encModels {
		t.Run(model, func(t *testing.T) {
			tk := encLoad(t, model)
			checked := 0
			rng := rand.New(rand.NewPCG(1, 2))
			for _, text := range boundaryTexts(t, model, 60) {
				for _, add := range []bool{false, true} {
					ids, bs, err := tk.EncodeBoundaries(text, add)
					if err != nil {
						t.Fatal(err)
					}
					plain, _ := tk.Encode(text, add)
					if !slices.Equal(plain, ids) {
						t.Fatalf("EncodeBoundaries ids differ from Encode for %q", text)
					}
					if text != "" && (len(bs) == 0 || bs[len(bs)-1].Offset != len(text)) {
						t.Fatalf("last boundary is not the end of the text: %v", bs)
					}
					for i, b := range bs {
						if i > 0 && b.Offset <= bs[i-1].Offset {
							t.Fatalf("boundaries not ascending: %v", bs)
						}
						// check every boundary of short texts, a sample of long ones
						if len(bs) > 40 && rng.IntN(len(bs)) >= 40 {
							continue
						}
						suf, err := tk.EncodeSuffix(text, b.Offset, add)
						if err != nil {
							t.Fatal(err)
						}
						got := append(slices.Clip(ids[:b.Tokens]), suf...)
						if !slices.Equal(got, ids) {
							t.Fatalf("add=%v text %q: boundary %+v (prefix %q):\n want %v\n got  %v",
								add, clip(text, 400), b, clip(text[:b.Offset], 200), clipIDs(ids[b.Tokens:]), clipIDs(suf))
						}
						checked++
					}
				}
			}
			t.Logf("%s: %d boundaries checked", model, checked)
		})
	}
}

var mixedParts = []string{
	"The quick brown fox jumps over the lazy dog. ", "It's 2024-06-01, isn't it? ", "  \t  ", "\n\n", "\r\n",
	"func main() {\n\tfmt.Println(\"hi\")\n}\n", "    return x**2 + y_1;\n", "日本語のテキストと中文字符。", "한국어 문장입니다. ",
	"emoji 👩‍💻🚀✨ ", "1234567890 ", "3.14159e-10", "Ünïcödé café naïve ", "e\u0301 a\u0308 q\u0301\u0323 ",
	"<|im_start|>user\nhello<|im_end|>\n", "<s>[INST] hi [/INST]", "<start_of_turn>user\n", "<|begin_of_text|>",
	"<｜User｜>hi<｜Assistant｜>", "      ", "\u00a0\u2003\u3000", "don'T WE'LL I'M", "▁▁x ▁", "<bos>", "<|endoftext|>",
}

func mixedText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(mixedParts[rng.IntN(len(mixedParts))])
		if rng.IntN(4) == 0 {
			fmt.Fprintf(&b, "%d", rng.IntN(100000))
		}
	}
	return b.String()
}

// FuzzEncode: no input makes the encoder fail or panic, and every boundary
// satisfies the EncodeSuffix property (qwen3 and the synthetic tokenizers,
// which cover the prefix-adding and stripping components).
// go test ./tokenization -run '^$' -fuzz FuzzEncode -fuzztime 60s
func FuzzEncode(f *testing.F) {
	for _, s := range mixedParts {
		f.Add(s)
	}
	toks := []*Tokenizer{encLoad(f, "qwen3")}
	for _, v := range variantFixtures {
		tk, err := Load([]byte(v.tokenizerJSON), nil)
		if err != nil {
			f.Fatal(err)
		}
		toks = append(toks, tk)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tk := range toks {
			ids, bs, err := tk.EncodeBoundaries(s, true)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range bs {
				suf, err := tk.EncodeSuffix(s, b.Offset, true)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(append(slices.Clip(ids[:b.Tokens]), suf...), ids) {
					t.Fatalf("%q boundary %+v", s, b)
				}
			}
			if len(bs) > 0 {
				b := bs[len(bs)/2]
				_, sb, err := tk.EncodeSuffixBoundaries(s, b.Offset, true)
				if err != nil {
					t.Fatal(err)
				}
				var want []Boundary
				for _, x := range bs {
					if x.Offset >= b.Offset {
						want = append(want, Boundary{x.Offset, x.Tokens - b.Tokens})
					}
				}
				if !slices.Equal(sb, want) {
					t.Fatalf("%q from %d: suffix boundaries %v, full %v", s, b.Offset, sb, want)
				}
			}
		}
	})
}

// TestEncodeSuffixBoundaries: the boundaries reported inside a suffix are
// exactly the full encoding's boundaries after from, shifted by the ids
// before from.
func TestEncodeSuffixBoundaries(t *testing.T) {
	for _, model := range encModels {
		t.Run(model, func(t *testing.T) {
			tk := encLoad(t, model)
			rng := rand.New(rand.NewPCG(3, 4))
			for _, text := range boundaryTexts(t, model, 30) {
				ids, bs, err := tk.EncodeBoundaries(text, true)
				if err != nil {
					t.Fatal(err)
				}
				if len(bs) == 0 {
					continue
				}
				b := bs[rng.IntN(len(bs))]
				suf, sb, err := tk.EncodeSuffixBoundaries(text, b.Offset, true)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(append(slices.Clip(ids[:b.Tokens]), suf...), ids) {
					t.Fatalf("suffix ids differ at %+v", b)
				}
				var want []Boundary
				for _, x := range bs {
					if x.Offset >= b.Offset {
						want = append(want, Boundary{x.Offset, x.Tokens - b.Tokens})
					}
				}
				if !slices.Equal(sb, want) {
					t.Fatalf("%q from %d:\n suffix boundaries %v\n full after from  %v", clip(text, 300), b.Offset, sb, want)
				}
			}
		})
	}
}

// refContinuation is continuation without scanStart: the splits of the whole
// prefix.
func refContinuation(t *Tokenizer, text string, from int) (normCont, preCont bool) {
	splits := t.rawTrie.split(text[:from], nil)
	last := splits[len(splits)-1]
	if last.tok != nil {
		return false, false
	}
	if t.normTrie.empty {
		return true, true
	}
	nt := normText{s: text[last.start:from], base: last.start}
	if t.norm != nil {
		nt, _ = t.norm.normalize(nt, true)
	}
	ns := t.normTrie.split(nt.s, nil)
	if n := len(ns); n > 0 && ns[n-1].tok != nil {
		return true, false
	}
	return true, true
}

// TestContinuationWindow: scanning only from scanStart gives what scanning
// the whole prefix gives, at every offset (lstrip/rstrip/normalized tokens of
// the synthetic tokenizers, whitespace runs around tokens).
func TestContinuationWindow(t *testing.T) {
	toks := map[string]*Tokenizer{"qwen3": encLoad(t, "qwen3")}
	for _, v := range variantFixtures {
		// each also with every added token matched on the raw text and no
		// single_word token (then only the window's scan decides)
		raw := strings.NewReplacer(`"normalized":true`, `"normalized":false`, `"single_word":true`, `"single_word":false`).Replace(v.tokenizerJSON)
		for name, tj := range map[string]string{v.name: v.tokenizerJSON, v.name + "/raw": raw} {
			tk, err := Load([]byte(tj), nil)
			if err != nil {
				t.Fatal(err)
			}
			toks[name] = tk
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	parts := append([]string{" ", "  ", "\n", "\u00a0", "x", "<", ">", "<s>", "</s>", "[LR]", "[L]", "[R]", "[SEP]", "HeLLo", "hello", "word", "ab", "é"}, mixedParts...)
	n := 300
	if race.Enabled {
		n = 30
	}
	for name, tk := range toks {
		st := new(encState)
		for i := 0; i < n; i++ {
			var b strings.Builder
			for n := rng.IntN(12); n >= 0; n-- {
				b.WriteString(parts[rng.IntN(len(parts))])
			}
			text := b.String()
			for from := 1; from <= len(text); from++ {
				nc, pc, err := tk.continuation(st, text, from)
				if err != nil {
					t.Fatal(err)
				}
				if wn, wp := refContinuation(tk, text, from); nc != wn || pc != wp {
					t.Fatalf("%s: %q at %d: continuation %v %v, full scan %v %v", name, text, from, nc, pc, wn, wp)
				}
			}
		}
	}
}
