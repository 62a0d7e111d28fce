package promises

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// pickID makes one pick over HTTP and returns its pick id.
func pickID(t *testing.T, d *harness.Daemon, body string) string {
	t.Helper()
	code, out, _ := d.Do("POST", "/v1/pick", body)
	var p struct {
		PickID string `json:"pick_id"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(out), &p) != nil || len(p.PickID) != 16 {
		t.Fatalf("/v1/pick: %d %s", code, out)
	}
	return p.PickID
}

// feedbackCode answers pick id with the engine's reported cached tokens
// and returns the HTTP status.
func feedbackCode(t *testing.T, d *harness.Daemon, id string) (int, string) {
	t.Helper()
	code, body, _ := d.Do("POST", "/v1/feedback", fmt.Sprintf(`{"pick_id":%q,"cached_tokens":0,"prompt_tokens":64}`, id))
	return code, body
}

// docs/security.md, "Pick state": the picks awaiting feedback are bounded
// by --feedback-capacity (the oldest gives way, counted, and its feedback
// is 404) and --feedback-ttl (an older pick is dropped, counted).
func TestPromiseFeedbackCapacity(t *testing.T) {
	t.Parallel()
	const capacity = 5
	d := harness.Start(t, "--feedback-capacity", fmt.Sprint(capacity), "--feedback-ttl", "8s") // long enough for 8 picks and 4 feedbacks on a loaded machine
	ids, _ := json.Marshal(prompt(3, 4))
	body := `{"model":"` + model + `","token_ids":` + string(ids) + `,"candidates":[{"pod":"pod-a"},{"pod":"pod-b"}]}`

	picks := make([]string, capacity+3)
	for i := range picks {
		picks[i] = pickID(t, d, body)
	}
	if v := d.Metric("kvindexd_feedback_pending"); v != capacity {
		t.Fatalf("pending = %v after %d picks, want the capacity %d", v, len(picks), capacity)
	}
	if v := d.Metric("kvindexd_feedback_evicted_total"); v != 3 {
		t.Fatalf("evicted = %v, want 3", v)
	}
	// The oldest three gave way: their feedback is 404 / NotFound, saying
	// the capacity; the most recent is answered.
	for _, id := range picks[:3] {
		if code, out := feedbackCode(t, d, id); code != http.StatusNotFound || !strings.Contains(out, "capacity of 5") {
			t.Fatalf("feedback on evicted pick %s: %d %s", id, code, out)
		}
	}
	if code, out := feedbackCode(t, d, picks[len(picks)-1]); code != http.StatusOK {
		t.Fatalf("feedback on the newest pick: %d %s", code, out)
	}
	if v := d.Metric(`kvindexd_feedback_rejected_total{reason="unknown_pick"}`); v != 3 {
		t.Fatalf("unknown_pick rejections = %v, want 3", v)
	}

	// Past --feedback-ttl a pick waiting for feedback is dropped: the four
	// still pending are counted expired, and their feedback is 404.
	start := time.Now()
	wait.Until(t, "the pending picks to expire", func() string {
		// an expiry is noticed at the next pick or feedback: feedback on
		// an evicted pick (404 either way) lets the daemon look
		feedbackCode(t, d, picks[0])
		if v := d.Metric("kvindexd_feedback_expired_total"); v != 4 {
			return fmt.Sprintf("expired = %v after %v, want 4", v, time.Since(start))
		}
		return ""
	})
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("expiry took %v with --feedback-ttl 8s", el)
	}
	if code, out := feedbackCode(t, d, picks[3]); code != http.StatusNotFound || !strings.Contains(out, "older than 8s") {
		t.Fatalf("feedback on an expired pick: %d %s", code, out)
	}
	if v := d.Metric("kvindexd_feedback_pending"); v != 0 {
		t.Fatalf("pending = %v after the TTL", v)
	}
}

// docs/security.md, "Pick state": pick-quality series are per model only
// for models an engine published for (bounded by --max-models), other
// model names share the label "_other"; per-(model, pod) series stop at
// 1,000 pairs, the rest counted.
func TestPromiseQualitySeriesBounded(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	ids, _ := json.Marshal(prompt(3, 2))
	const pods = 1000 + 7
	for i := range pods {
		// a new model name and a new pod on every pick
		pickID(t, d, fmt.Sprintf(`{"model":"made-up/%d","token_ids":%s,"candidates":[{"pod":"pod-%d"}]}`, i, ids, i))
	}
	metrics := d.MetricsBody()
	if strings.Contains(metrics, `model="made-up/`) {
		t.Fatal("a model no engine published for got its own series")
	}
	if v := harness.MetricIn(metrics, `kvindexd_pick_prompt_blocks_total{model="_other"}`); v != 2*pods {
		t.Fatalf(`prompt blocks under "_other" = %v, want %d`, v, 2*pods)
	}
	if n := strings.Count(metrics, "kvindexd_pick_pod_picks_total{"); n != 1000 {
		t.Fatalf("%d per-pod pick series, want 1000", n)
	}
	if v := harness.MetricIn(metrics, "kvindexd_pick_quality_pods_omitted_total"); v != 7 {
		t.Fatalf("pods omitted = %v, want 7", v)
	}
}
