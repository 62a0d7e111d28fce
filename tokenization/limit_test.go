package tokenization

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// EncodeLimit changes nothing below the limit: on the HuggingFace golden
// cases (npm tokenizers, hack/tokenizers/gen-golden.mjs) a limit equal to
// the reference's id count gives the reference's ids, and one less gives
// ErrTooManyTokens.
func TestEncodeLimitParity(t *testing.T) {
	for _, model := range []string{"qwen3", "llama2"} {
		t.Run(model, func(t *testing.T) {
			tk := encLoad(t, model)
			cases := readGolden(t, model)
			bad := 0
			for _, c := range cases {
				got, err := tk.EncodeLimit(c.Text, c.Add, len(c.IDs))
				_, errOver := tk.EncodeLimit(c.Text, c.Add, len(c.IDs)-1)
				wantOver := len(c.IDs) > 1 // a limit of 0 is no limit
				if err == nil && slices.Equal(got, c.IDs) && errors.Is(errOver, ErrTooManyTokens) == wantOver {
					continue
				}
				if bad++; bad <= 5 {
					t.Errorf("text=%s: limit %d: %v err=%v; limit %d: err=%v", clip(c.Text, 200),
						len(c.IDs), clipIDs(got), err, len(c.IDs)-1, errOver)
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d cases differ", bad, len(cases))
			}
		})
	}
}

// An over-limit prompt stops within a word of the limit: the work is
// counted as the context checks the encoder makes (one per 64 KiB of words
// encoded), not timed. 8 MB of short words at a 1,000-token limit is
// refused after about 5 KB; without the limit it is encoded to the end.
func TestEncodeLimitStopsEarly(t *testing.T) {
	tk := encLoad(t, "qwen3")
	text := strings.Repeat("several short words, 漢字と仮名。", 200_000) // 7.6 MB
	ctx := newDoneAfter(1 << 40)
	_, _, err := tk.EncodeBoundariesLimit(ctx, text, true, 1000)
	if !errors.Is(err, ErrTooManyTokens) || !strings.Contains(err.Error(), "more than 1000") {
		t.Fatalf("err = %v, want ErrTooManyTokens naming the limit", err)
	}
	if n := ctx.calls.Load(); n != 1 {
		t.Fatalf("%d context checks (64 KiB of words each) before the refusal, want 1 (the start)", n)
	}
	_, _, err = tk.EncodeSuffixBoundariesLimit(ctx, text, 0, true, 1000)
	if !errors.Is(err, ErrTooManyTokens) {
		t.Fatalf("suffix: err = %v, want ErrTooManyTokens", err)
	}

	// the same prompt without a limit does all the work: the check above can fail
	all := newDoneAfter(1 << 40)
	ids, _, err := tk.EncodeBoundariesContext(all, text, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := all.calls.Load(); n < int64(len(text)>>16)-1 {
		t.Fatalf("unlimited: %d context checks, want about %d", n, len(text)>>16)
	}
	// and a limit at its id count gives the same ids
	got, err := tk.EncodeLimit(text, true, len(ids))
	if err != nil || !slices.Equal(got, ids) {
		t.Fatalf("limit = id count: %d ids, err %v; want %d ids", len(got), err, len(ids))
	}
}

// The special tokens count: llama2 adds a BOS, and a limit that fits the
// text but not its BOS is refused.
func TestEncodeLimitCountsSpecialTokens(t *testing.T) {
	tk := encLoad(t, "llama2")
	ids, err := tk.Encode("hello world", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.EncodeLimit("hello world", true, len(ids)-1); !errors.Is(err, ErrTooManyTokens) {
		t.Fatalf("limit %d for %d ids (BOS included): err = %v", len(ids)-1, len(ids), err)
	}
	if _, err := tk.EncodeLimit("hello world", false, len(ids)-1); err != nil {
		t.Fatalf("without BOS the ids fit: %v", err)
	}
}
