package promises

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// simEngine is an engine as a router sees it: it answers a request with an
// OpenAI-compatible body whose usage reports the prompt tokens it served
// from its cache (vLLM's usage.prompt_tokens_details.cached_tokens). Its
// cache is what it says, not what its events said: an engine that lost
// its cache without publishing the removals disagrees with the index.
type simEngine struct{ cachedTokens int }

func (e *simEngine) serve(promptTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"object": "text_completion", "usage": map[string]any{
		"prompt_tokens": promptTokens, "completion_tokens": 1, "total_tokens": promptTokens + 1,
		"prompt_tokens_details": map[string]any{"cached_tokens": min(e.cachedTokens, promptTokens)}}})
	return b
}

// Issue 36: a router hands the engine's reported cached tokens back for
// each pick (HTTP and gRPC, the Go client doing it); the daemon compares
// them with its prediction under vLLM's rule (a fully cached prompt
// recomputes its last block) and raises the drift alarm, as the parity
// check does, when a simulated engine disagrees with the index.
func TestPromiseFeedbackDriftAlarm(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(7, 8) // 8 blocks, 128 tokens
	publish(t, pub, "pod-a", model, 0, stored(engineHashes(t, toks), toks))
	wait.Until(t, "pod-a holding the prompt", func() string {
		if got := d.ScoreTokens(model, toks)["pod-a"]; got != 8 {
			return fmt.Sprintf("pod-a matches %d blocks", got)
		}
		return ""
	})
	ids, _ := json.Marshal(toks)
	pickBody := `{"model":"` + model + `","token_ids":` + string(ids) + `,"candidates":[{"pod":"pod-a"},{"pod":"pod-b"}]}`
	engine := &simEngine{cachedTokens: len(toks)}
	type feedbackAnswer struct {
		PredictedTokens int  `json:"predicted_tokens"`
		ReportedTokens  int  `json:"reported_tokens"`
		Disagrees       bool `json:"disagrees"`
	}
	httpRound := func() feedbackAnswer {
		t.Helper()
		code, body, _ := d.Do("POST", "/v1/pick", pickBody)
		var pick struct {
			Pod    string `json:"pod"`
			PickID string `json:"pick_id"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &pick) != nil || pick.Pod != "pod-a" || len(pick.PickID) != 16 {
			t.Fatalf("/v1/pick: %d %s", code, body)
		}
		u, ok := client.ParseUsage(engine.serve(len(toks)))
		if !ok {
			t.Fatal("the engine's usage does not parse")
		}
		code, body, _ = d.Do("POST", "/v1/feedback", fmt.Sprintf(`{"pick_id":%q,"cached_tokens":%d,"prompt_tokens":%d}`,
			pick.PickID, u.CachedTokens, u.PromptTokens))
		var a feedbackAnswer
		if code != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil {
			t.Fatalf("/v1/feedback: %d %s", code, body)
		}
		return a
	}
	// The engine holds the whole prompt: vLLM reports 112 of 128 tokens
	// (the last block is recomputed), which is what the index predicts.
	engine.cachedTokens = 112
	for range 8 {
		if a := httpRound(); a.PredictedTokens != 112 || a.Disagrees {
			t.Fatalf("agreeing engine: %+v", a)
		}
	}
	alarm := `kvindexd_feedback_alarm{model="` + model + `",pod="pod-a"}`
	if v := d.Metric(alarm); v != 0 {
		t.Fatalf("%s = %v with an agreeing engine", alarm, v)
	}

	// The engine loses its cache without telling: it reports nothing
	// cached, through the Go client over gRPC.
	cl, err := client.New(client.Config{Addr: d.GRPC, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	engine.cachedTokens = 0
	for range 24 {
		dec, err := cl.Pick(context.Background(), &client.Request{Model: model, TokenIDs: toks,
			Candidates: []client.Candidate{{Pod: "pod-a"}, {Pod: "pod-b"}}})
		if err != nil || dec.Fallback || dec.Pod != "pod-a" || dec.PickID == "" {
			t.Fatalf("client pick: %+v %v", dec, err)
		}
		u, _ := client.ParseUsage(engine.serve(len(toks)))
		res, err := cl.Feedback(context.Background(), dec, u)
		if err != nil || !res.Disagrees || res.PredictedTokens != 112 || res.ReportedTokens != 0 || res.Pod != "pod-a" {
			t.Fatalf("client feedback: %+v %v", res, err)
		}
	}
	// 24 of the last 32 feedbacks disagree: the alarm is up, in the
	// metrics, in /v1/models with its hint, and in one warning line.
	if v := d.Metric(alarm); v != 1 {
		t.Fatalf("%s = %v after the engine disagreed", alarm, v)
	}
	if v := d.Metric(`kvindexd_feedback_error_tokens_total{model="` + model + `",pod="pod-a"}`); v != 24*112 {
		t.Fatalf("error tokens = %v, want %d", v, 24*112)
	}
	code, body := d.Get("/v1/models")
	var models struct {
		Models []struct {
			Model string `json:"model"`
			Picks *struct {
				Picks uint64 `json:"picks"`
				Pods  []struct {
					Pod   string `json:"pod"`
					Alarm bool   `json:"alarm"`
					Hint  string `json:"hint"`
				} `json:"pods"`
			} `json:"picks"`
		} `json:"models"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &models) != nil || len(models.Models) != 1 || models.Models[0].Picks == nil ||
		models.Models[0].Picks.Picks != 32 || len(models.Models[0].Picks.Pods) != 1 || !models.Models[0].Picks.Pods[0].Alarm ||
		models.Models[0].Picks.Pods[0].Hint == "" {
		t.Fatalf("/v1/models: %d %s", code, body)
	}
	if n := strings.Count(d.Logs.String(), "pick feedback drift"); n != 1 {
		t.Fatalf("%d drift warnings in the log, want 1:\n%s", n, harness.LastLines(d.Logs.String(), 20))
	}
	// A pick is answered once; a made-up id is 404 / NotFound.
	if code, body, _ := d.Do("POST", "/v1/feedback", `{"pick_id":"00000000000000ff","cached_tokens":0}`); code != http.StatusNotFound {
		t.Fatalf("unknown pick id: %d %s", code, body)
	}
	if code, body, _ := d.Do("POST", "/v1/feedback", `{"pick_id":"xyz","cached_tokens":0}`); code != http.StatusBadRequest {
		t.Fatalf("malformed pick id: %d %s", code, body)
	}
	if v := d.Metric(`kvindexd_feedback_rejected_total{reason="unknown_pick"}`); v != 1 {
		t.Fatalf("unknown_pick rejections = %v", v)
	}
	if v := d.Metric(`kvindexd_feedback_rejected_total{reason="invalid"}`); v != 1 {
		t.Fatalf("invalid rejections = %v", v)
	}
}
