package promises

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/race"
)

// cjkSentences is about n bytes of random CJK ideographs in sentences of 1
// to 40 characters ended by a full-width comma or stop: real CJK text's
// shape, every sentence one pre-token.
func cjkSentences(n int) string {
	r := rand.New(rand.NewPCG(7, 8))
	var sb strings.Builder
	for sb.Len() < n {
		for k := 1 + r.IntN(40); k > 0; k-- {
			sb.WriteRune(rune(0x4E00 + r.IntN(20000)))
		}
		sb.WriteString([]string{"，", "。"}[r.IntN(2)])
	}
	return sb.String()
}

// Issue 35: an over-limit prompt (8.1 MB of CJK, ~4M tokens: under
// --max-prompt-bytes, over the 1,048,576-token limit) is refused with 400 /
// InvalidArgument naming the limit, as a prompt and as rendered messages,
// and the refusal comes from the tokenizer stopping at the limit
// (refused_total{reason="too_many_tokens"}), not from a count after all of
// it was tokenized. A normal prompt still answers.
func TestPromisePromptTokenLimitStopsTokenizing(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, tokenizerFlag(t))
	text := cjkSentences(8_100_000)
	code, body := scorePrompt(d, text)
	if code != http.StatusBadRequest || !strings.Contains(body, "InvalidArgument") || !strings.Contains(body, "limit 1048576") {
		t.Fatalf("8.1 MB CJK prompt: %d %s; want 400 InvalidArgument naming the token limit", code, clipBody(body))
	}
	if v := d.Metric(`kvindexd_prompt_tokenize_refused_total{reason="too_many_tokens"}`); v != 1 {
		t.Fatalf(`refused_total{reason="too_many_tokens"} = %v, want 1 (stopped at the limit)`, v)
	}

	msgs, _ := json.Marshal(map[string]any{"model": model,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	resp, err := http.Post("http://"+d.HTTP+"/v1/score", "application/json", bytes.NewReader(msgs))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(b.String(), "InvalidArgument") || !strings.Contains(b.String(), "limit 1048576") {
		t.Fatalf("8.1 MB CJK messages: %d %s; want 400 InvalidArgument naming the token limit", resp.StatusCode, clipBody(b.String()))
	}
	if v := d.Metric(`kvindexd_prompt_tokenize_refused_total{reason="too_many_tokens"}`); v != 2 {
		t.Fatalf(`refused_total{reason="too_many_tokens"} = %v after the messages, want 2`, v)
	}
	if v := d.Metric("kvindexd_prompt_tokenize_errors_total"); v != 0 {
		t.Errorf("kvindexd_prompt_tokenize_errors_total = %v, want 0 (a refusal is not an error)", v)
	}
	if code, body := scorePrompt(d, "a prompt of usual size, 普通の長さ"); code != http.StatusOK {
		t.Fatalf("normal prompt: %d %s", code, body)
	}
}

func clipBody(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// Issue 35: a prompt that is one pre-tokenized word (an unbroken run of
// 2.7M CJK ideographs, 8.1 MB, 4.3M tokens) and provably over the token
// limit is refused before it is merged: a lower bound on its ids
// (tokenization/bound.go) passes the limit. The test fails above 320 MiB of
// peak RSS (the daemon, the 8 MB body and its decoded prompt, the bound's 2
// bytes per byte, the automaton): 197 MB; merged whole before the refusal,
// as before the bound, the same test peaked at 552 MB.
func TestPromisePromptTokenLimitOneWord(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, tokenizerFlag(t))
	chars := 2_700_000
	if race.Enabled {
		// the race-built daemon takes minutes over 8.1 MB, past
		// --http-write-timeout, and the RSS bound is not checked there:
		// 800k ideographs (~1.3M tokens) still pass the limit
		chars = 800_000
	}
	code, body := scorePrompt(d, cjkRun(chars))
	if code != http.StatusBadRequest || !strings.Contains(body, "InvalidArgument") || !strings.Contains(body, "limit 1048576") {
		t.Fatalf("one-word CJK prompt of %d ideographs: %d %s; want 400 InvalidArgument naming the token limit", chars, code, clipBody(body))
	}
	if v := d.Metric(`kvindexd_prompt_tokenize_refused_total{reason="too_many_tokens"}`); v != 1 {
		t.Fatalf(`refused_total{reason="too_many_tokens"} = %v, want 1`, v)
	}
	rss := d.PeakRSS()
	t.Logf("peak RSS %d MB", rss>>20)
	if rss > 320<<20 && !race.Enabled {
		t.Errorf("peak RSS %d MB refusing one 8.1 MB word, want below 320 MiB (it was merged)", rss>>20)
	}
	if code, body := scorePrompt(d, "a prompt of usual size, 普通の長さ"); code != http.StatusOK {
		t.Fatalf("normal prompt: %d %s", code, body)
	}
}
