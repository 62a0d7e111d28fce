package client

import (
	"context"
	"errors"
	"testing"
)

// The usage shapes are the engines' documented response bodies: vLLM's
// OpenAI-compatible usage with prompt_tokens_details (also SGLang's with
// --enable-cache-report) and SGLang's native meta_info.
func TestParseUsage(t *testing.T) {
	for _, c := range []struct {
		body string
		want Usage
		ok   bool
	}{
		{`{"id":"cmpl-1","usage":{"prompt_tokens":128,"completion_tokens":5,"total_tokens":133,"prompt_tokens_details":{"cached_tokens":112}}}`, Usage{112, 128}, true},
		{`{"text":"hi","meta_info":{"id":"x","prompt_tokens":40,"completion_tokens":3,"cached_tokens":32}}`, Usage{32, 40}, true},
		{`{"usage":{"prompt_tokens":128,"completion_tokens":5,"total_tokens":133,"prompt_tokens_details":null}}`, Usage{}, false},
		{`{"usage":{"prompt_tokens":128}}`, Usage{}, false},
		{`not json`, Usage{}, false},
	} {
		got, ok := ParseUsage([]byte(c.body))
		if got != c.want || ok != c.ok {
			t.Errorf("ParseUsage(%s) = %+v %v, want %+v %v", c.body, got, ok, c.want, c.ok)
		}
	}
}

func TestFeedbackWithoutPickID(t *testing.T) {
	c, err := New(Config{Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Feedback(context.Background(), &Decision{Fallback: true}, Usage{}); !errors.Is(err, ErrNoPickID) {
		t.Fatalf("fallback feedback: %v", err)
	}
}
