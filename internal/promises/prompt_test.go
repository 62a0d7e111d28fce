package promises

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// tokenizerFlag serves model with the committed qwen3 tokenizer.
func tokenizerFlag(t *testing.T) string {
	t.Helper()
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return "--tokenizer=" + model + "=" + filepath.Join(root, "tokenization", "testdata", "qwen3")
}

// cjkRun is n random CJK ideographs with no space: one pre-token, one BPE word.
func cjkRun(n int) string {
	r := rand.New(rand.NewPCG(5, 6))
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = rune(0x4E00 + r.IntN(20000))
	}
	return string(rs)
}

// answerLimit bounds the wait for a prompt score's answer, a hang guard only:
// the first prompt a daemon sees loads the tokenizer (over 20 s race-built),
// a prompt of 1-3 MB takes the race-built tokenizer tens of seconds more, and
// a neighbour on the same two cores stretches both.
const answerLimit = 5 * time.Minute

// scorePrompt sends a prompt score and returns the status and body (0 and
// the error when no answer came within answerLimit).
func scorePrompt(d *harness.Daemon, prompt string) (int, string) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt})
	c := &http.Client{Timeout: answerLimit}
	resp, err := c.Post("http://"+d.HTTP+"/v1/score", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// Issue 26 item 8: a prompt that is one unbroken run of CJK characters (a single
// 7.5 MB pre-token) from a client that leaves while it is being tokenized. The tokenizer stops
// when the request ends (counted in kvindexd_prompt_tokenize_cancelled_total) instead of
// finishing work nobody waits for, and the daemon keeps answering.
func TestPromisePromptWorkStopsWithRequest(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, tokenizerFlag(t))
	if code, body := scorePrompt(d, "warm the tokenizer"); code != http.StatusOK {
		t.Fatalf("small prompt: %d %s", code, body)
	}
	// The client leaves once its prompt is being tokenized (the in-flight gauge
	// shows it), while the tokenizer is in the middle of the word.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": cjkRun(2_500_000)})
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+d.HTTP+"/v1/score", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan string, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- ""
			return
		}
		resp.Body.Close()
		answered <- resp.Status
	}()
	wait.Until(t, "the long prompt being tokenized", func() string {
		if v := d.Metric("kvindexd_prompt_tokenize_inflight_bytes"); v == 0 {
			return "nothing in flight yet"
		}
		return ""
	})
	cancel()
	if status := <-answered; status != "" {
		t.Fatalf("the long prompt was answered (%s) before the client left: make it longer", status)
	}
	wait.Until(t, "tokenization stopped with its request", func() string {
		if v := d.Metric("kvindexd_prompt_tokenize_cancelled_total"); v != 1 {
			return fmt.Sprintf("kvindexd_prompt_tokenize_cancelled_total = %v, want 1", v)
		}
		return ""
	})
	if v := d.Metric("kvindexd_prompt_tokenize_errors_total"); v != 0 {
		t.Errorf("kvindexd_prompt_tokenize_errors_total = %v, want 0 (a cancellation is not an error)", v)
	}
	if code, body := scorePrompt(d, "still answering"); code != http.StatusOK {
		t.Fatalf("after: %d %s", code, body)
	}
}

// Issue 26 item 5, with the defaults: a prompt above --max-prompt-bytes (8 MiB) is
// refused with 400 / InvalidArgument before any work, and one that tokenizes to more
// than 1,048,576 tokens (the token_ids bound) with 400 as well.
func TestPromisePromptSize(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, tokenizerFlag(t))
	code, body := scorePrompt(d, strings.Repeat("a", 8<<20+1))
	if code != http.StatusBadRequest || !strings.Contains(body, "InvalidArgument") || !strings.Contains(body, "--max-prompt-bytes") {
		t.Fatalf("8 MiB + 1 byte: %d %s; want 400 InvalidArgument naming --max-prompt-bytes", code, body)
	}
	if v := d.Metric(`kvindexd_prompt_tokenize_refused_total{reason="too_long"}`); v != 1 {
		t.Fatalf(`refused_total{reason="too_long"} = %v, want 1`, v)
	}
	// qwen3 splits digits one by one: 1.1 MB of digits are 1.1M tokens
	code, body = scorePrompt(d, strings.Repeat("7", 1_100_000))
	if code != http.StatusBadRequest || !strings.Contains(body, "limit 1048576") {
		t.Fatalf("1.1M digits: %d %s; want 400 naming the token limit", code, body)
	}
	if code, body := scorePrompt(d, "a prompt of usual size"); code != http.StatusOK {
		t.Fatalf("small prompt: %d %s", code, body)
	}
}

// Issue 26 item 5: the memory of concurrent tokenization is bounded. With a 3 MB
// in-flight budget, 12 clients each send a 3 MB prompt that is one run of CJK
// characters (the costliest shape: one BPE word) at once. They are tokenized one at a
// time; those that wait longer than 2 s get 429 / ResourceExhausted, the others 400
// (too many tokens); the in-flight gauge never passes the budget and the peak RSS stays
// far below what 12 at once would take (~2.9 GB, ~80 bytes per prompt byte).
func TestPromiseTokenizeInflightBytes(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	const budget = 3_000_000
	d := harness.Start(t, tokenizerFlag(t), fmt.Sprintf("--tokenize-max-inflight-bytes=%d", budget),
		fmt.Sprintf("--max-prompt-bytes=%d", budget))
	prompt := cjkRun(budget / 3)
	var wg sync.WaitGroup
	codes := make([]int, 12)
	bodies := make([]string, len(codes))
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], bodies[i] = scorePrompt(d, prompt)
		}()
	}
	done := make(chan struct{})
	var peak float64
	go func() {
		defer close(done)
		for {
			select {
			case <-time.After(20 * time.Millisecond):
				if v := harness.MetricIn(d.MetricsBody(), "kvindexd_prompt_tokenize_inflight_bytes"); v > peak {
					peak = v
				}
			case <-allDone(&wg):
				return
			}
		}
	}()
	<-done
	busy := 0
	for i, c := range codes {
		switch {
		case c == http.StatusTooManyRequests && strings.Contains(bodies[i], "ResourceExhausted"):
			busy++
		case c == http.StatusBadRequest && strings.Contains(bodies[i], "InvalidArgument") &&
			(strings.Contains(bodies[i], "tokens, limit") || strings.Contains(bodies[i], "too many tokens")):
		default:
			t.Errorf("client %d: %d %s; want 429 ResourceExhausted or 400 (token limit)", i, c, bodies[i])
		}
	}
	if busy == 0 {
		t.Errorf("no client was refused: the budget let them all in")
	}
	if v := d.Metric(`kvindexd_prompt_tokenize_refused_total{reason="busy"}`); int(v) != busy {
		t.Errorf(`refused_total{reason="busy"} = %v, want %d`, v, busy)
	}
	if peak > budget {
		t.Errorf("in-flight bytes reached %v, budget %d", peak, budget)
	}
	if v := d.Metric("kvindexd_prompt_tokenize_inflight_bytes"); v != 0 {
		t.Errorf("in-flight bytes %v after every request ended", v)
	}
	if rss := d.PeakRSS(); rss > 1<<30 && !race.Enabled { // the race detector's shadow memory is not the daemon's
		t.Errorf("peak RSS %d MB, want below 1 GiB", rss>>20)
	}
	t.Logf("%d of %d refused as busy; peak in-flight %v bytes; peak RSS %d MB", busy, len(codes), peak, d.PeakRSS()>>20)
}

// allDone turns wg.Wait into a channel.
func allDone(wg *sync.WaitGroup) <-chan struct{} {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	return c
}
