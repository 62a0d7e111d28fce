package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
)

const repoTokenizer = "../../tokenization/testdata/qwen3"

// TestMain: the demo runs the daemon as `make demo` builds it, without
// -race (a race-built daemon loads the tokenizer too slowly for the demo's
// minute).
func TestMain(m *testing.M) { os.Exit(harness.Main(m, harness.PlainBuild())) }

// The shared system prompts are long enough to be the 8-block prefixes the
// fleet's requests share.
func TestDemoSystemPromptsAreWholeBlocks(t *testing.T) {
	_, tok, err := loadTokenizer(repoTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range systemPrompts {
		ids, err := tok.Encode(p, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) < 8*blockSize {
			t.Errorf("system prompt %d is %d tokens, want at least %d (8 blocks)", i, len(ids), 8*blockSize)
		}
	}
	if _, _, err := loadTokenizer(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing tokenizer directory is accepted")
	}
}

// The demo's daemon scores prompts (it has the model's tokenizer), and a
// prompt starting with a system prompt matches the pods the fleet served
// it on: what the status page's score form shows.
func TestDemoScoresPrompts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon")
	}
	bin := harness.Binary(t)
	_, tok, err := loadTokenizer(repoTokenizer)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := tok.Encode(systemPrompts[1], true)
	if err != nil {
		t.Fatal(err)
	}
	wantBlocks := len(sys) / blockSize

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		best int
		err  error
		body string
	}
	got := make(chan answer, 1)
	o := options{bin: bin, tokenizerDir: repoTokenizer, duration: time.Minute, every: time.Hour,
		onReady: func(base string) {
			defer cancel() // ends the demo
			body, _ := json.Marshal(map[string]string{"model": model, "prompt": systemPrompts[1] + " Please review my change."})
			var a answer
			for ctx.Err() == nil {
				a = answer{}
				resp, err := http.Post(base+"/v1/score", "application/json", bytes.NewReader(body))
				if err != nil {
					a.err = err
				} else {
					var sr scoreResp
					var buf bytes.Buffer
					_, _ = buf.ReadFrom(resp.Body)
					resp.Body.Close()
					a.body = buf.String()
					if resp.StatusCode != http.StatusOK {
						got <- a // a daemon without a tokenizer answers 422: no retry helps
						return
					}
					if err := json.Unmarshal(buf.Bytes(), &sr); err != nil {
						a.err = err
					}
					for _, p := range sr.Pods {
						a.best = max(a.best, p.MatchedBlocks)
					}
					if a.best >= wantBlocks {
						break
					}
				}
				time.Sleep(200 * time.Millisecond)
			}
			got <- a
		}}
	if err := run(ctx, o); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil || a.best < wantBlocks {
			t.Fatalf("a prompt starting with system prompt B: best pod holds %d blocks, want %d (the system prompt's); err %v, answer %s",
				a.best, wantBlocks, a.err, a.body)
		}
	default:
		t.Fatal("the demo ended before the daemon was ready")
	}
}
