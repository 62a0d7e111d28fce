package tokenization

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
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

// latinRun is n random lower-case letters: one pre-tokenized word.
func latinRun(n int) string {
	r := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b)
}

// allocated is the bytes f allocates (the encoder's memory is its work: a
// merged word costs ~28 bytes per byte in symbols and merge queue).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A prompt that is one pre-tokenized word (a run of CJK ideographs, a run
// of letters) and provably over the limit is refused before it is merged:
// the refusal allocates the bound's 2 bytes per byte and the ids' room up to
// the limit (4 bytes per id, ~1.3 per byte here), not the merge's ~28; at its
// id count the same word is merged (the check can fail).
func TestEncodeLimitStopsEarlyOneWord(t *testing.T) {
	tk := encLoad(t, "qwen3")
	// the automaton is built once per model, on the first long word
	if a, err := tk.model.segAutomaton(context.Background()); a == nil || err != nil {
		t.Fatalf("qwen3 has no bound automaton (%v)", err)
	}
	for _, c := range []struct {
		name string
		text string
	}{{"cjk", cjkRun(200_000)}, {"latin", latinRun(600_000)}} {
		t.Run(c.name, func(t *testing.T) {
			full, err := tk.Encode(c.text, true)
			if err != nil {
				t.Fatal(err)
			}
			limit := len(full) * 3 / 4
			var lerr error
			got := allocated(func() { _, _, lerr = tk.EncodeBoundariesLimit(context.Background(), c.text, true, limit) })
			if !errors.Is(lerr, ErrTooManyTokens) {
				t.Fatalf("%d ids, limit %d: err = %v, want ErrTooManyTokens", len(full), limit, lerr)
			}
			if max := uint64(len(c.text))*2 + uint64(limit)*4 + 1<<20; got > max {
				t.Fatalf("refusing %d bytes (%d ids, limit %d) allocated %d bytes, want at most %d (2 per byte, 4 per id): it was merged",
					len(c.text), len(full), limit, got, max)
			}
			all := allocated(func() { _, _, err = tk.EncodeBoundariesLimit(context.Background(), c.text, true, len(full)) })
			if err != nil || all < uint64(len(c.text))*16 {
				t.Fatalf("at its id count: err %v, %d bytes allocated, want a merge (at least 16 per byte)", err, all)
			}
			t.Logf("%d bytes, %d ids, limit %d: refusal allocated %d bytes, the encode %d", len(c.text), len(full), limit, got, all)
		})
	}
}

// The refusal is exact: on the committed models (qwen3 and the synthetic
// variant tokenizers, byte fallback, unk, prefix and suffix schemes
// included), EncodeLimit refuses a prompt exactly when its full encode has
// more ids than the limit, and below it gives the full encode's ids, for
// one-word prompts at, under and over the limit.
func TestEncodeLimitDecisionIsExact(t *testing.T) {
	type model struct {
		name string
		tk   *Tokenizer
	}
	models := []model{{"qwen3", encLoad(t, "qwen3")}}
	for _, v := range variantFixtures {
		tk, err := Load([]byte(v.tokenizerJSON), nil)
		if err != nil {
			t.Fatal(err)
		}
		models = append(models, model{v.name, tk})
	}
	r := rand.New(rand.NewPCG(11, 12))
	alphabets := []string{"abcdefghijklmnopqrstuvwxyz", "helo wrd", "漢字仮名語", "aé漢🙂12", "ababababab", "xyzq"}
	word := func(alpha []rune, n int) string {
		var sb strings.Builder
		for range n {
			sb.WriteRune(alpha[r.IntN(len(alpha))])
		}
		return sb.String()
	}
	bounded := 0
	for _, m := range models {
		for _, a := range alphabets {
			for _, n := range []int{1, 2, 5, 40, 300, 1500, 3000} { // from 1 KiB the bound runs
				text := word([]rune(a), n)
				for _, add := range []bool{false, true} {
					full, err := m.tk.Encode(text, add)
					if err != nil {
						t.Fatal(err)
					}
					k := len(full)
					for _, limit := range []int{1, k / 2, k*9/10 - 1, k - 2, k - 1, k, k + 1, 2 * k} {
						if limit <= 0 {
							continue
						}
						got, err := m.tk.EncodeLimit(text, add, limit)
						over := errors.Is(err, ErrTooManyTokens)
						if over != (k > limit) || (!over && (err != nil || !slices.Equal(got, full))) {
							t.Fatalf("%s: %q add=%v: %d ids, limit %d: got %d ids, err %v", m.name, clip(text, 80), add, k, limit, len(got), err)
						}
					}
				}
				// and the bound itself refuses some words before merging
				ids, _ := m.tk.Encode(text, false)
				if len(ids) > 2 && m.tk.model.checkBound(context.Background(), len(text), len(ids)/2, func(emit func(uint32) bool) error {
					syms := m.tk.model.initialSymbols(nil, text)
					for _, s := range syms {
						if !emit(s.id) {
							break
						}
					}
					return nil
				}) != nil {
					bounded++
				}
			}
		}
	}
	if bounded == 0 {
		t.Fatal("the bound refused no word at half its ids: the test does not reach it")
	}
	t.Logf("%d words refused by the bound at half their ids", bounded)
}

// The automaton is built once per model in the background: a request that
// ends while it is built returns with its context's error at once, and the
// next request gets the automaton.
func TestBoundAutomatonBuildLeavesCancelledRequest(t *testing.T) {
	tj, cj, err := ReadTokenizerFiles(encFixtureDir("qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Load(tj, cj) // a model of its own: nothing built yet
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if a, err := tk.model.segAutomaton(ctx); a != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request while the automaton is built: %v, %v; want context.Canceled", a != nil, err)
	}
	if a, err := tk.model.segAutomaton(context.Background()); a == nil || err != nil {
		t.Fatalf("next request: automaton %v, err %v", a != nil, err)
	}
}
