package chattemplate

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/tokenization"
)

// benchConversation is a 20-turn chat (system prompt, 20 user and 20
// assistant messages) of about 8k Qwen3 tokens, cut from the tokenizer
// benchmark's mixed-language text.
func benchConversation(b *testing.B) *Request {
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
		for !utf8.Valid(s) { // keep whole runes
			s = s[:len(s)-1]
		}
		return string(s)
	}
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
	for i := 0; i < 40; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": cut(i)})
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		b.Fatal(err)
	}
	return &Request{Messages: raw}
}

func BenchmarkRender20Turns(b *testing.B) {
	tpl, err := LoadDir("testdata/templates/qwen3", "")
	if err != nil {
		b.Fatal(err)
	}
	tk, err := tokenization.LoadDir("../testdata/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	req := benchConversation(b)
	prompt, err := renderText(tpl, req)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := tk.Encode(prompt, false)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("prompt: %d bytes, %d tokens", len(prompt), len(ids))
	if len(ids) < 7000 || len(ids) > 10000 {
		b.Fatalf("conversation has %d tokens, want about 8k", len(ids))
	}
	b.Run("render", func(b *testing.B) {
		b.SetBytes(int64(len(prompt)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := renderText(tpl, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("render+tokenize", func(b *testing.B) {
		b.SetBytes(int64(len(prompt)))
		b.ReportAllocs()
		for b.Loop() {
			p, err := renderText(tpl, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tk.Encode(p, false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse-template", func(b *testing.B) {
		src, err := os.ReadFile("testdata/templates/qwen3/tokenizer_config.json")
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := Load(src, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
