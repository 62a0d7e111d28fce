package tokenization

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// benchText is the shared 90 KB mixed text (prose, code, CJK, emoji, digits,
// whitespace runs) that hack/tokenizers/bench.mjs also feeds to the Rust
// reference, so the two timings compare.
func benchText(b *testing.B) string {
	data, err := readGz(filepath.Join("testdata", "bench_mixed_90k.txt.gz"))
	if err != nil {
		b.Fatal(err)
	}
	return string(data)
}

// BenchmarkEncode90KB: go test ./tokenization -run '^$' -bench Encode90KB -benchtime 20x
func BenchmarkEncode90KB(b *testing.B) {
	text := benchText(b)
	for _, model := range encModels {
		b.Run(model, func(b *testing.B) {
			tk := encLoad(b, model)
			if _, err := tk.Encode(text, true); err != nil { // warm the word cache like a server
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := tk.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad measures model load time (JSON parse + tables).
func BenchmarkLoad(b *testing.B) {
	for _, model := range encModels {
		b.Run(model, func(b *testing.B) {
			encLoad(b, model) // skip when absent
			tj, cj, err := ReadTokenizerFiles(encFixtureDir(model))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := Load(tj, cj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeSuffix is the prefix-store hit path: a ~8k-token prompt
// whose first ~7k tokens are known, so only the text after the last
// boundary before 7/8 of the ids is encoded.
// go test ./tokenization -run '^$' -bench 'EncodeSuffix|PromptFull' -benchtime 50x
func BenchmarkEncodeSuffix(b *testing.B) {
	tk, text, from := suffixSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tk.EncodeSuffix(text, from, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPromptFull is the same prompt encoded from scratch.
func BenchmarkPromptFull(b *testing.B) {
	tk, text, _ := suffixSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tk.Encode(text, true); err != nil {
			b.Fatal(err)
		}
	}
}

func suffixSetup(b *testing.B) (*Tokenizer, string, int) {
	tk := encLoad(b, "qwen3")
	text := benchText(b)
	_, bs, err := tk.EncodeBoundaries(text, true)
	if err != nil {
		b.Fatal(err)
	}
	// cut the text at ~8k tokens
	end := len(text)
	for _, bd := range bs {
		if bd.Tokens >= 8000 {
			end = bd.Offset
			break
		}
	}
	text = text[:end]
	ids, bs, _ := tk.EncodeBoundaries(text, true)
	from := 0
	for _, bd := range bs {
		if bd.Tokens > len(ids)*7/8 {
			break
		}
		from = bd.Offset
	}
	return tk, text, from
}

// BenchmarkEncodeLongRun encodes one unbroken run of CJK characters (a single
// pre-token, so a single BPE word). Merging is O(n log n): each size's ns/op
// must stay near twice the previous one's (a quadratic merge makes it 4x).
// go test ./tokenization -run '^$' -bench EncodeLongRun -benchtime 5x
func BenchmarkEncodeLongRun(b *testing.B) {
	for _, model := range encModels {
		for _, n := range []int{100_000, 200_000, 400_000} {
			b.Run(model+"/"+strconv.Itoa(n/1000)+"k", func(b *testing.B) {
				tk := encLoad(b, model)
				text := cjkRun(n)
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					if _, err := tk.Encode(text, true); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// cjkSentences is about n bytes of random CJK ideographs in sentences of
// 1 to 40 characters, each ended by a full-width comma or stop: every
// sentence is a pre-token of its own, as in real CJK text.
func cjkSentences(n int) string {
	r := rand.New(rand.NewPCG(5, 6))
	var sb strings.Builder
	sb.Grow(n + 128)
	for sb.Len() < n {
		for k := 1 + r.IntN(40); k > 0; k-- {
			sb.WriteRune(rune(0x4E00 + r.IntN(20000)))
		}
		sb.WriteString([]string{"，", "。"}[r.IntN(2)])
	}
	return sb.String()
}

// BenchmarkEncodeOverLimit is issue 35's over-limit prompt: 8.1 MB of CJK
// sentences (~4M ids) against the daemon's 1,048,576-token limit. "full" is
// the work before the limit stopped the encoder (everything, then refused
// for its length), "limit" the work now (up to the limit, then refused);
// "word-*" are the same for a prompt that is one word.
// go test ./tokenization -run '^$' -bench EncodeOverLimit -benchtime 2x
func BenchmarkEncodeOverLimit(b *testing.B) {
	tk := encLoad(b, "qwen3")
	text := cjkSentences(8_100_000)
	const limit = 1 << 20
	b.Run("full", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			ids, _, err := tk.EncodeBoundariesContext(context.Background(), text, true)
			if err != nil || len(ids) <= limit {
				b.Fatalf("%d ids, err %v: want an over-limit prompt", len(ids), err)
			}
			b.ReportMetric(float64(len(ids)), "ids")
		}
	})
	b.Run("limit", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			if _, _, err := tk.EncodeBoundariesLimit(context.Background(), text, true, limit); !errors.Is(err, ErrTooManyTokens) {
				b.Fatalf("err = %v, want ErrTooManyTokens", err)
			}
		}
	})
	// The same size as one word, an unbroken run of CJK ideographs: "word-full"
	// merges all of it (the work before the bound, bound.go), "word-limit"
	// is refused by the bound before merging.
	word := cjkRun(2_700_000)
	b.Run("word-full", func(b *testing.B) {
		b.SetBytes(int64(len(word)))
		for b.Loop() {
			ids, _, err := tk.EncodeBoundariesContext(context.Background(), word, true)
			if err != nil || len(ids) <= limit {
				b.Fatalf("%d ids, err %v: want an over-limit prompt", len(ids), err)
			}
			b.ReportMetric(float64(len(ids)), "ids")
		}
	})
	b.Run("word-limit", func(b *testing.B) {
		_, _ = tk.model.segAutomaton(context.Background()) // built once per model
		b.SetBytes(int64(len(word)))
		for b.Loop() {
			if _, _, err := tk.EncodeBoundariesLimit(context.Background(), word, true, limit); !errors.Is(err, ErrTooManyTokens) {
				b.Fatalf("err = %v, want ErrTooManyTokens", err)
			}
		}
	})
}
