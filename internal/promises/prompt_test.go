package promises

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// tokenizerFlag serves model with the committed qwen3 tokenizer.
func tokenizerFlag(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
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

// scorePrompt sends a prompt score with a client timeout and returns the status (0
// when the client gave up first).
func (d *daemon) scorePrompt(prompt string, timeout time.Duration) (int, string) {
	d.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt})
	c := &http.Client{Timeout: timeout}
	resp, err := c.Post("http://"+d.http+"/v1/score", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// Issue 26 item 8: a prompt that is one unbroken run of CJK characters (a single
// 7.5 MB pre-token) from a client that leaves after half a second. The tokenizer stops
// when the request ends (counted in kvindexd_prompt_tokenize_cancelled_total) instead of
// finishing work nobody waits for, and the daemon keeps answering.
func TestPromisePromptWorkStopsWithRequest(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, tokenizerFlag(t))
	if code, body := d.scorePrompt("warm the tokenizer", waitLimit); code != http.StatusOK {
		t.Fatalf("small prompt: %d %s", code, body)
	}
	if code, body := d.scorePrompt(cjkRun(2_500_000), 500*time.Millisecond); code != 0 {
		t.Fatalf("the long prompt was answered (%d %s) before the client left: make it longer", code, body)
	}
	eventually(t, waitLimit, "tokenization stopped with its request", func() string {
		if v := d.metric("kvindexd_prompt_tokenize_cancelled_total"); v != 1 {
			return fmt.Sprintf("kvindexd_prompt_tokenize_cancelled_total = %v, want 1", v)
		}
		return ""
	})
	if v := d.metric("kvindexd_prompt_tokenize_errors_total"); v != 0 {
		t.Errorf("kvindexd_prompt_tokenize_errors_total = %v, want 0 (a cancellation is not an error)", v)
	}
	if code, body := d.scorePrompt("still answering", waitLimit); code != http.StatusOK {
		t.Fatalf("after: %d %s", code, body)
	}
}
