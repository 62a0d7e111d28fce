package prefixstore

import (
	"compress/gzip"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvindex/kvindex/tokenization"
)

// benchPrompt returns an ~8k-token qwen3 prompt cut from the shared benchmark text
// (tokenization/testdata/bench_mixed_90k.txt.gz, also read by hack/tokenizers/bench.mjs),
// split into its first ~7/8 (the cached prefix) and the rest.
func benchPrompt(b *testing.B, tok *tokenization.Tokenizer) (prefix, tail string) {
	b.Helper()
	f, err := os.Open(filepath.Join("..", "tokenization", "testdata", "bench_mixed_90k.txt.gz"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	text := string(raw)
	all, err := tok.Encode(text, true)
	if err != nil {
		b.Fatal(err)
	}
	n := runeCut(text, len(text)*8000/len(all))
	cut := runeCut(text, n*7/8)
	return text[:cut], text[cut:n]
}

// BenchmarkPrefixStoreHit: an ~8k-token prompt whose first ~7k tokens are cached; every
// iteration's tail is new (a unique marker starts it), as for a fresh request sharing a
// long system prompt. Compare with BenchmarkFullTokenize.
func BenchmarkPrefixStoreHit(b *testing.B) {
	tok := needModel(b, "qwen3")
	prefix, tail := benchPrompt(b, tok)
	m := NewMetrics(nil)
	s := New(Config{}, registry(), m)
	ctx := context.Background()
	if _, err := s.TokenizePrompt(ctx, "qwen3", prefix+"warm-up"); err != nil {
		b.Fatal(err)
	}
	var ntok int
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		ids, err := s.TokenizePrompt(ctx, "qwen3", prefix+"#"+strconv.Itoa(i)+" "+tail)
		if err != nil {
			b.Fatal(err)
		}
		ntok = len(ids)
	}
	b.StopTimer()
	hits, reused := value(m.hits), value(m.reusedTokens)
	b.ReportMetric(float64(ntok), "tokens/op")
	b.ReportMetric(reused/max(hits, 1), "reused-tokens/hit")
	if hits < float64(b.N) {
		b.Fatalf("only %v hits in %d iterations", hits, b.N)
	}
}

// BenchmarkFullTokenize: the same prompts tokenized in full.
func BenchmarkFullTokenize(b *testing.B) {
	tok := needModel(b, "qwen3")
	prefix, tail := benchPrompt(b, tok)
	var ntok int
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		ids, err := tok.Encode(prefix+"#"+strconv.Itoa(i)+" "+tail, true)
		if err != nil {
			b.Fatal(err)
		}
		ntok = len(ids)
	}
	b.ReportMetric(float64(ntok), "tokens/op")
}

// BenchmarkPrefixStoreRepeat: the same ~8k-token prompt again (everything but the last
// chunk and the safety margin is reused): the store's own overhead.
func BenchmarkPrefixStoreRepeat(b *testing.B) {
	tok := needModel(b, "qwen3")
	prefix, tail := benchPrompt(b, tok)
	prompt := prefix + tail
	s := New(Config{}, registry(), nil)
	ctx := context.Background()
	if _, err := s.TokenizePrompt(ctx, "qwen3", prompt); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.TokenizePrompt(ctx, "qwen3", prompt); err != nil {
			b.Fatal(err)
		}
	}
}

// cjkRun is n random CJK ideographs with no space: one pre-token for every supported
// pre-tokenizer, the worst case for work that walks back to the start of a run.
func cjkRun(n int) string {
	r := rand.New(rand.NewPCG(3, 4))
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = rune(0x4E00 + r.IntN(20000))
	}
	return string(rs)
}

// BenchmarkLongRun is a cold prompt that is one unbroken run of CJK characters. The
// store's work per request must grow as n log n at most: compare the ns/op of the two
// sizes (the ratio must stay near 2, not 4).
// go test ./prefixstore -run '^$' -bench LongRun -benchtime 5x
func BenchmarkLongRun(b *testing.B) {
	needModel(b, "qwen3")
	for _, n := range []int{100_000, 200_000} {
		b.Run(strconv.Itoa(n/1000)+"k", func(b *testing.B) {
			prompt := cjkRun(n)
			s := New(Config{}, registry(), nil)
			ctx := context.Background()
			if _, err := s.TokenizePrompt(ctx, "qwen3", "load the model"); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(prompt)))
			for i := 0; b.Loop(); i++ {
				// a different first character makes every iteration a miss
				p := string(rune('a'+i%26)) + prompt
				if _, err := s.TokenizePrompt(ctx, "qwen3", p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
