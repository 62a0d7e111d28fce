package prefixstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
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

type gaugeValue struct{ v float64 }

func (g *gaugeValue) Set(v float64) { g.v = v }

// The in-flight budget grants in arrival order, refuses with ErrBusy after the wait,
// returns the context's error when the request ends first, and gives back what it took.
func TestByteBudget(t *testing.T) {
	g := &gaugeValue{}
	b := newByteBudget(100, g)
	ctx := context.Background()
	if err := b.acquire(ctx, 60, time.Second); err != nil {
		t.Fatal(err)
	}
	if g.v != 60 {
		t.Fatalf("gauge %v, want 60", g.v)
	}
	// 50 does not fit: it waits, and is refused when nothing is released
	if err := b.acquire(ctx, 50, 10*time.Millisecond); !errors.Is(err, ErrBusy) {
		t.Fatalf("err = %v, want ErrBusy", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.acquire(cctx, 50, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// a waiting large request is not overtaken by a small one that would fit
	granted := make(chan int, 2)
	go func() {
		if b.acquire(ctx, 50, time.Minute) == nil {
			granted <- 50
		}
	}()
	for {
		b.mu.Lock()
		n := len(b.waiters)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	go func() {
		if b.acquire(ctx, 10, time.Minute) == nil {
			granted <- 10
		}
	}()
	for {
		b.mu.Lock()
		n := len(b.waiters)
		b.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// 10 would fit next to the 60 held, but waits behind the 50
	if h := b.used(); h != 60 {
		t.Fatalf("held %d while the 50 waits, want 60 (the 10 overtook it)", h)
	}
	b.release(60)
	if a, c := <-granted, <-granted; a+c != 60 {
		t.Fatalf("granted %d and %d, want 50 and 10", a, c)
	}
	b.release(50)
	b.release(10)
	if b.used() != 0 || g.v != 0 {
		t.Fatalf("held %d, gauge %v after every release", b.used(), g.v)
	}
}
