package chatprompt

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"runtime"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// benchTurns builds a 20-turn chat (system prompt, 20 user and 20 assistant
// messages, ~8k Qwen3 tokens of the tokenizer benchmark's mixed-language
// text); turns[i] is the request of turn i+1, ending with its user message.
func benchTurns(b *testing.B) []*chattemplate.Request {
	f, err := os.Open("../testdata/bench_mixed_90k.txt.gz")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	text, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	const perMessage = 740 // bytes: ~200 tokens of mixed text
	cut := func(i int) string {
		s := text[i*perMessage : (i+1)*perMessage]
		for !utf8.Valid(s) {
			s = s[:len(s)-1]
		}
		return string(s)
	}
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
	var turns []*chattemplate.Request
	for i := 0; i < 40; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": cut(i)})
		if role == "user" {
			raw, err := json.Marshal(msgs)
			if err != nil {
				b.Fatal(err)
			}
			turns = append(turns, &chattemplate.Request{Messages: raw})
		}
	}
	return turns
}

// BenchmarkChat20Turns is render + tokenize of the 20th turn of an ~8k-token
// conversation through the prefix store:
//   - cold: the store has never seen the conversation (first time);
//   - warm: the store holds turn 19, as it does when the router scored the
//     previous turn (only the new assistant and user messages are tokenized).
//
// Compare the two ns/op: cold/warm is what the prefix store saves a growing
// conversation; "render" is the template alone, which warm still pays in
// full. The template is loaded before the timer starts in all three.
func BenchmarkChat20Turns(b *testing.B) {
	turns := benchTurns(b)
	last, prev := turns[len(turns)-1], turns[len(turns)-2]
	treg := registry()
	r, err := New(Config{Registry: treg, Tokenizer: prefixstore.New(prefixstore.Config{}, treg, nil)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	toks, err := r.TokenizeChat(ctx, "qwen3", last, false)
	ids := toks.IDs
	if err != nil {
		b.Fatal(err)
	}
	prompt, _ := renderText(r, "qwen3", last)
	b.Logf("turn 20: %d bytes, %d tokens", len(prompt), len(ids))
	if len(ids) < 7000 || len(ids) > 10000 {
		b.Fatalf("conversation has %d tokens, want about 8k", len(ids))
	}
	run := func(b *testing.B, warm bool) {
		b.ReportAllocs()
		b.SetBytes(int64(len(prompt)))
		for b.Loop() {
			b.StopTimer()
			r.tok = prefixstore.New(prefixstore.Config{}, treg, nil) // an empty store
			if warm {
				if _, err := r.TokenizeChat(ctx, "qwen3", prev, false); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC() // the priming's garbage is not the measured call's
			b.StartTimer()
			if _, err := r.TokenizeChat(ctx, "qwen3", last, false); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("cold", func(b *testing.B) { run(b, false) })
	b.Run("warm", func(b *testing.B) { run(b, true) })
	// The render alone: what warm costs beyond the new messages' tokens.
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := renderText(r, "qwen3", last); err != nil {
				b.Fatal(err)
			}
		}
	})
}
