package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// TestPredictionMissRateShowsWrongTemplate: two models share the Qwen3
// tokenizer; "right" renders with Qwen3's own template, "wrong" with a
// configured override that is one token off (as an operator might get it
// wrong). Chats are scored on both; the engine then stores the blocks of
// the RIGHT rendering (the reference ids: Jinja2 + HF tokenizers) for each.
// Once the window passes, the right model's predictions were all seen and
// the wrong model's almost all missed, in GET /v1/models and the metrics.
func TestPredictionMissRateShowsWrongTemplate(t *testing.T) {
	// ChatML as Qwen3 writes it, but opening with <|endoftext|>: a template
	// that adds a BOS token the engine's does not, one token off.
	wrongTemplate := filepath.Join(t.TempDir(), "chatml_bos.jinja")
	src := "<|endoftext|>{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
		"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	if err := os.WriteFile(wrongTemplate, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	e := startInProcess(t, func(c *Config) {
		c.BlockSize = 4
		c.Tokenizers = map[string]string{"right": qwen3Dir, "wrong": qwen3Dir}
		c.Models = map[string]ModelConfig{"wrong": {ChatTemplate: wrongTemplate}}
		c.PredictionSampleRate = 1
		c.PredictionWindow = Duration(3 * time.Second)
	})
	cases := loadChatCases(t)
	// Each scored chat is followed at once by the engine storing the right
	// rendering's blocks, so only a stall longer than the window could turn
	// a right prediction into a miss.
	scored := map[string]int{}
	for _, model := range []string{"right", "wrong"} {
		e.publish("engine", model, []uint32{1, 2, 3, 4}) // the model becomes known
	}
	for _, c := range cases {
		if c.ids == nil {
			continue
		}
		for _, model := range []string{"right", "wrong"} {
			code, body := e.postScore(withFields(c.body, map[string]any{"model": model}))
			if code != http.StatusOK {
				t.Fatalf("%s %s: %d %s", model, c.name, code, body)
			}
			scored[model]++
			e.publish("engine", model, c.ids)
		}
	}
	if scored["right"] < 40 || scored["wrong"] < 40 {
		t.Fatalf("scored %v", scored)
	}
	type pred struct {
		Predicted uint64  `json:"predicted_blocks"`
		Seen      uint64  `json:"seen_blocks"`
		Missed    uint64  `json:"missed_blocks"`
		Pending   uint64  `json:"pending_blocks"`
		MissRate  float64 `json:"miss_rate"`
		Hint      string  `json:"hint"`
	}
	got := map[string]pred{}
	wait.Until(t, "predictions settled", func() string {
		code, body := e.get("/v1/models")
		var out struct {
			PredictionEnabled bool `json:"prediction_enabled"`
			Models            []struct {
				Model      string `json:"model"`
				Prediction pred   `json:"prediction"`
			} `json:"models"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || !out.PredictionEnabled {
			return fmt.Sprintf("%d %s", code, body)
		}
		for _, m := range out.Models {
			got[m.Model] = m.Prediction
		}
		r, w := got["right"], got["wrong"]
		if r.Predicted > 0 && w.Predicted > 0 && r.Pending == 0 && w.Pending == 0 {
			return ""
		}
		return "still " + body
	})
	r, w := got["right"], got["wrong"]
	t.Logf("right: %+v", r)
	t.Logf("wrong: %+v", w)
	if r.Missed != 0 || r.Seen != r.Predicted || r.MissRate != 0 || r.Hint != "" {
		t.Errorf("right template: %+v, want every predicted block seen", r)
	}
	if w.MissRate < 0.95 || w.Predicted < 100 || w.Hint == "" {
		t.Errorf("wrong template: %+v, want a miss rate near 1 with a hint", w)
	}
	code, metrics := e.get("/metrics")
	if code != http.StatusOK {
		t.Fatal(code)
	}
	for name, want := range map[string]uint64{
		`kvindexd_prediction_blocks_seen_total{model="right"}`:   r.Seen,
		`kvindexd_prediction_blocks_missed_total{model="wrong"}`: w.Missed,
	} {
		m := regexp.MustCompile(regexp.QuoteMeta(name) + ` (\S+)`).FindStringSubmatch(metrics)
		if m == nil {
			t.Errorf("metric %s missing", name)
			continue
		}
		if v, _ := strconv.ParseFloat(m[1], 64); uint64(v) != want {
			t.Errorf("%s = %s, want %d", name, m[1], want)
		}
	}
	if !strings.Contains(metrics, "kvindexd_prediction_pending_blocks 0") {
		t.Error("pending gauge not 0 after settling")
	}
}
