package tokenization

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPathologicalWhitespace: 100k spaces / newlines / tabs mixes must not
// backtrack catastrophically on any fixture model. The deadline is far above
// normal (tens of ms) and only guards against a hang; the reference ids for
// the 100k-space and 100k-newline texts are in the golden files.
func TestPathologicalWhitespace(t *testing.T) {
	texts := []string{
		strings.Repeat(" ", 100000),
		strings.Repeat("\n", 100000),
		strings.Repeat(" \n", 50000),
		strings.Repeat("\t ", 50000) + "x",
		strings.Repeat(" ", 100000) + "x" + strings.Repeat("\r\n", 1000),
		strings.Repeat("a ", 50000),
		strings.Repeat("!", 100000),
		strings.Repeat("1", 100000),
	}
	for _, model := range encModels {
		t.Run(model, func(t *testing.T) {
			tk := encLoad(t, model)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				for _, s := range texts {
					if _, err := tk.Encode(s, true); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("encoding 100k-character whitespace runs did not finish: catastrophic backtracking")
			}
		})
	}
}

// TestConcurrentEncode runs encoders in parallel (meaningful under -race)
// and checks they agree with a sequential encode.
func TestConcurrentEncode(t *testing.T) {
	tk := encLoad(t, "qwen3")
	cases := readGolden(t, "qwen3")
	var texts []string
	for i, c := range cases {
		if i%7 == 0 && len(c.Text) < 2000 {
			texts = append(texts, c.Text)
		}
	}
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i], _ = tk.Encode(s, true)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := range texts {
				k := (i*7 + g*13) % len(texts)
				got, bs, err := tk.EncodeBoundaries(texts[k], true)
				if err != nil || !slices.Equal(got, want[k]) {
					errs <- texts[k]
					return
				}
				if len(bs) > 0 {
					b := bs[len(bs)/2]
					suf, _ := tk.EncodeSuffix(texts[k], b.Offset, true)
					if !slices.Equal(append(slices.Clip(got[:b.Tokens]), suf...), got) {
						errs <- texts[k]
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for s := range errs {
		t.Errorf("concurrent encode differs for %q", clip(s, 200))
	}
}

func TestEncodeSuffixRange(t *testing.T) {
	tk := encLoad(t, "qwen3")
	if _, err := tk.EncodeSuffix("abc", 4, false); err == nil {
		t.Error("offset past the end accepted")
	}
	if _, err := tk.EncodeSuffix("abc", -1, false); err == nil {
		t.Error("negative offset accepted")
	}
	full, _ := tk.Encode("hello world", true)
	got, _ := tk.EncodeSuffix("hello world", 0, true)
	if !slices.Equal(full, got) {
		t.Errorf("EncodeSuffix at 0 = %v, want Encode %v", got, full)
	}
}

// TestBoundariesAtSpecialTokens: the prefix store relies on boundaries
// around added tokens (chat templates).
func TestBoundariesAtSpecialTokens(t *testing.T) {
	tk := encLoad(t, "qwen3")
	text := "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>"
	_, bs, err := tk.EncodeBoundaries(text, false)
	if err != nil {
		t.Fatal(err)
	}
	offs := map[int]bool{}
	for _, b := range bs {
		offs[b.Offset] = true
	}
	for i := 0; i < len(text); i++ {
		if strings.HasPrefix(text[i:], "<|im_") && i > 0 && !offs[i] {
			t.Errorf("no boundary before the special token at %d", i)
		}
		if strings.HasPrefix(text[i:], "|>") && !offs[i+2] {
			t.Errorf("no boundary after the special token ending at %d", i+2)
		}
	}
}
