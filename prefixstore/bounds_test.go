package prefixstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// doneAfter is a context whose Err turns to Canceled after `after` calls: a request
// that ends while its prompt is being tokenized, without timing.
type doneAfter struct {
	context.Context
	after, calls int
}

func (c *doneAfter) Err() error {
	if c.calls++; c.calls > c.after {
		return context.Canceled
	}
	return nil
}

// A request that ends while its long prompt is tokenized gets its context's error, is
// counted as cancelled (not as a tokenizer error) and leaves nothing in the cache.
func TestTokenizeStopsWhenRequestEnds(t *testing.T) {
	needModel(t, "qwen3")
	m := NewMetrics(nil)
	s := New(Config{}, registry(), m)
	prompt := strings.Repeat("\u4e00\u4e8c\u4e09\u56db\u4e94", 40_000) // one 600 KB pre-token
	// alive for the store's check and the tokenizer's first, done at the merge loop's
	ctx := &doneAfter{Context: context.Background(), after: 2}
	_, err := s.TokenizePrompt(ctx, "qwen3", prompt)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if c, e := value(m.cancelled), value(m.errors); c != 1 || e != 0 {
		t.Fatalf("cancelled = %v, errors = %v; want 1, 0", c, e)
	}
	if st := s.Stats(); len(st) != 1 || st[0].Chunks != 0 {
		t.Fatalf("stats after a cancelled request: %+v", st)
	}
}

// A prompt above MaxPromptBytes is refused before any work, with ErrPromptTooLong.
func TestPromptTooLongRefused(t *testing.T) {
	needModel(t, "qwen3")
	m := NewMetrics(nil)
	s := New(Config{MaxPromptBytes: 1000}, registry(), m)
	if _, err := s.TokenizePrompt(context.Background(), "qwen3", strings.Repeat("x", 1000)); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	_, err := s.TokenizeRendered(context.Background(), "qwen3", strings.Repeat("x", 1001))
	if !errors.Is(err, ErrPromptTooLong) {
		t.Fatalf("err = %v, want ErrPromptTooLong", err)
	}
	if v := value(m.refused.WithLabelValues("too_long")); v != 1 {
		t.Fatalf("refused{too_long} = %v, want 1", v)
	}
	if s.cfg.MaxInflightBytes != DefaultMaxInflightBytes {
		t.Fatalf("in-flight budget %d, want the default", s.cfg.MaxInflightBytes)
	}
	if s := New(Config{MaxPromptBytes: 5000, MaxInflightBytes: 10}, registry(), nil); s.cfg.MaxInflightBytes != 5000 {
		t.Fatalf("a budget below the largest prompt must be raised to it, got %d", s.cfg.MaxInflightBytes)
	}
}

// A prompt whose ids pass MaxPromptTokens is refused with ErrTooManyTokens
// naming the limit, counted as refused{too_many_tokens} (not an error), on
// a miss and on a hit (the cached prefix's ids count towards the limit);
// prompts at the limit get Encode's ids.
func TestPromptTooManyTokensRefused(t *testing.T) {
	needModel(t, "qwen3")
	m := NewMetrics(nil)
	s := New(Config{MaxPromptTokens: 400, ChunkBytes: 64}, registry(), m)
	tok, err := registry().Get("qwen3")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := strings.Repeat("several short words, ", 50) // ~200 ids, cached below
	ids, err := s.TokenizePrompt(ctx, "qwen3", base)
	if err != nil || len(ids) > 300 {
		t.Fatalf("base: %d ids, err %v", len(ids), err)
	}
	for _, tc := range []struct {
		name, prompt string
		hit          bool
	}{
		{"miss", strings.Repeat("other words here; ", 100), false},
		{"hit", base + strings.Repeat("more words, ", 200), true},
	} {
		hits := value(m.hits)
		_, err := s.TokenizePrompt(ctx, "qwen3", tc.prompt)
		if !errors.Is(err, ErrTooManyTokens) || !strings.Contains(err.Error(), "limit 400") {
			t.Fatalf("%s: err = %v, want ErrTooManyTokens naming limit 400", tc.name, err)
		}
		if got := value(m.hits) > hits; got != tc.hit {
			t.Fatalf("%s: prefix hit = %v, want %v", tc.name, got, tc.hit)
		}
	}
	if r, e := value(m.refused.WithLabelValues("too_many_tokens")), value(m.errors); r != 2 || e != 0 {
		t.Fatalf("refused{too_many_tokens} = %v, errors = %v; want 2, 0", r, e)
	}
	// the longest base + "x x ..." within 400 ids (a hit) gets Encode's ids
	prompt, want := base, ids
	for next := base + " x"; ; next += " x" {
		ids, _ := tok.Encode(next, true)
		if len(ids) > 400 {
			break
		}
		prompt, want = next, ids
	}
	got, err := s.TokenizePrompt(ctx, "qwen3", prompt)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%d ids under the limit: got %d ids, err %v", len(want), len(got), err)
	}
	if DefaultConfig().MaxPromptTokens != DefaultMaxPromptTokens {
		t.Fatalf("default limit %d", DefaultConfig().MaxPromptTokens)
	}
}
