package tokenization

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
)

// cjkRun is n random CJK ideographs with no space: a single pre-token for
// every supported pre-tokenizer.
func cjkRun(n int) string {
	r := rand.New(rand.NewPCG(3, 4))
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = rune(0x4E00 + r.IntN(20000))
	}
	return string(rs)
}

// doneAfter is a context whose Err turns to Canceled after `after` calls, so
// a test can end a request in the middle of an encode without timing.
type doneAfter struct {
	context.Context
	after, calls atomic.Int64
}

func newDoneAfter(after int64) *doneAfter {
	c := &doneAfter{Context: context.Background()}
	c.after.Store(after)
	return c
}

func (c *doneAfter) Err() error {
	if c.calls.Add(1) > c.after.Load() {
		return context.Canceled
	}
	return nil
}

// A request whose context ends while one long word is being merged stops
// there (the merge loop checks it: words are checked only after they are
// encoded), and so does one that ends between words.
func TestEncodeStopsWhenContextDone(t *testing.T) {
	tk := encLoad(t, "qwen3")
	for name, text := range map[string]string{
		"one_long_word": cjkRun(100_000),
		"many_words":    strings.Repeat("several short words, ", 20_000),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := newDoneAfter(1) // alive at the start, done at the first check
			_, _, err := tk.EncodeBoundariesContext(ctx, text, true)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if n := ctx.calls.Load(); n != 2 {
				t.Fatalf("context checked %d times, want 2 (once at the start, once when done)", n)
			}
			_, _, err = tk.EncodeSuffixBoundariesContext(newDoneAfter(1), text, 0, true)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("suffix: err = %v, want context.Canceled", err)
			}
			// a context that stays alive gives Encode's ids
			want, err := tk.Encode(text, true)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := tk.EncodeBoundariesContext(context.Background(), text, true)
			if err != nil || len(got) != len(want) {
				t.Fatalf("live context: %d ids, err %v; want %d ids", len(got), err, len(want))
			}
		})
	}
}
