package promises

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Daemons sharing Redis answer the same: a daemon that never received an
// event for the model or the pod gives the writer's answers (token ids,
// block hashes, a pods filter) and counts the model it learned from Redis.
func TestPromiseSharedRedisSameAnswer(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	writer := harness.Start(t, "--index", redis.URL())
	reader := harness.Start(t, "--index", redis.URL(), "--zmq-bind", "")
	toks := prompt(1, 6)
	hashes := engineHashes(t, toks)
	publish(t, writer.Publisher(), "pod-a", model, 0, stored(hashes, toks))
	wait.Until(t, "the writer", func() string {
		if got := writer.ScoreTokens(model, toks)["pod-a"]; got != 6 {
			return fmt.Sprintf("writer scores pod-a %d", got)
		}
		return ""
	})
	for _, req := range []map[string]any{
		{"model": model, "token_ids": toks},
		{"model": model, "block_hashes": hashes},
		{"model": model, "token_ids": toks, "pods": []string{"pod-a"}},
	} {
		w, r := writer.Scores(req), reader.Scores(req)
		if fmt.Sprint(w) != fmt.Sprint(r) || r["pod-a"] != 6 {
			t.Errorf("%v: writer %v, reader %v", req, w, r)
		}
	}
	if v := reader.Metric("kvindexd_shared_models_interned_total"); v != 1 {
		t.Errorf("reader's kvindexd_shared_models_interned_total = %v, want 1", v)
	}
}

// A restart from a snapshot answers warm (--snapshot-path): restored pods
// are listed stale and not scored until their stream resumes; a pod whose
// next sequence number follows the snapshot's is served with everything
// restored, a pod whose number went back (its engine restarted meanwhile)
// is cleared first.
func TestPromiseSnapshotRestartWarm(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "index.snap")
	first := harness.Start(t, "--snapshot-path", path)
	pub := first.Publisher()
	warm, gone := prompt(1, 8), prompt(2, 4)
	publish(t, pub, "pod-warm", model, 0, stored(engineHashes(t, warm), warm))
	publish(t, pub, "pod-restarted", model, 40, stored(engineHashes(t, gone), gone))
	wait.Until(t, "before the restart", func() string {
		if s := first.ScoreTokens(model, warm); s["pod-warm"] != 8 {
			return fmt.Sprintf("pod-warm: %v", s)
		}
		if s := first.ScoreTokens(model, gone); s["pod-restarted"] != 4 {
			return fmt.Sprintf("pod-restarted: %v", s)
		}
		return ""
	})
	first.Stop()

	second := harness.Start(t, "--snapshot-path", path)
	if v := second.Metric("kvindexd_snapshot_restored_entries"); v != 12 {
		t.Errorf("kvindexd_snapshot_restored_entries = %v, want 12", v)
	}
	if v := second.Metric("kvindexd_snapshot_stale_pods"); v != 2 {
		t.Errorf("kvindexd_snapshot_stale_pods = %v, want 2", v)
	}
	if p, ok := second.Pod("pod-warm"); !ok || !p.Stale {
		t.Errorf("pod-warm after the restart: %+v (listed %v), want stale", p, ok)
	}
	if s := second.ScoreTokens(model, warm); len(s) != 0 {
		t.Errorf("a stale pod is scored: %v", s)
	}
	pub = second.Publisher()
	next, fresh := prompt(3, 1), prompt(4, 1)
	publish(t, pub, "pod-warm", model, 1, stored(engineHashes(t, next), next))
	publish(t, pub, "pod-restarted", model, 0, stored(engineHashes(t, fresh), fresh))
	wait.Until(t, "after the streams resume", func() string {
		if s := second.ScoreTokens(model, warm); s["pod-warm"] != 8 {
			return fmt.Sprintf("pod-warm's restored prefix: %v", s)
		}
		if s := second.ScoreTokens(model, fresh); s["pod-restarted"] != 1 {
			return fmt.Sprintf("pod-restarted's new block: %v", s)
		}
		return ""
	})
	if s := second.ScoreTokens(model, gone); len(s) != 0 {
		t.Errorf("blocks of an engine restarted since the snapshot are scored: %v", s)
	}
	if v := second.Metric("kvindexd_snapshot_restart_clears_total"); v != 1 {
		t.Errorf("kvindexd_snapshot_restart_clears_total = %v, want 1", v)
	}
}

// An index that is down is never an empty score: with Redis gone the daemon
// is not ready (/readyz 503) and a score answers 503 with the reason; when
// Redis is back it is ready again.
func TestPromiseRedisDownIsUnavailable(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	d := harness.Start(t, "--index", redis.URL())
	toks := prompt(1, 2)
	body := fmt.Sprintf(`{"model":%q,"token_ids":%s}`, model, jsonIDs(toks))
	redis.Kill()
	wait.Until(t, "not ready while Redis is down", func() string {
		if code, _ := d.Get("/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Sprintf("/readyz %d", code)
		}
		return ""
	})
	if code, resp, _ := d.Do("POST", "/v1/score", body); code != http.StatusServiceUnavailable || !strings.Contains(resp, "unavailable") {
		t.Fatalf("score with Redis down: %d %s, want 503 naming the index", code, resp)
	}
	redis.Restart()
	wait.Until(t, "ready once Redis is back", func() string {
		if code, _ := d.Get("/readyz"); code != http.StatusOK {
			return fmt.Sprintf("/readyz %d", code)
		}
		return ""
	})
}

func jsonIDs(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

// TestPromiseRedisLossIsIncomplete: a Redis killed and restarted empty while
// a pod is idle answers without error, but the pod's entries are gone; the
// daemon notices the new run_id (checked every second) and lists every pod
// incomplete ("index_lost") until an engine snapshot, clear or restart
// rebuilds it, counting kvindexd_index_lost_total{reason="restart"}.
func TestPromiseRedisLossIsIncomplete(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	d := harness.Start(t, "--index", redis.URL())
	pub := d.Publisher()
	toks := prompt(31, 2)
	publish(t, pub, "pod-lost", model, 0, stored(engineHashes(t, toks), toks))
	wait.Until(t, "the pod indexed and complete", func() string {
		if got := d.ScoreTokens(model, toks)["pod-lost"]; got != 2 {
			return fmt.Sprintf("pod-lost scores %d", got)
		}
		if _, body := d.Get("/v1/pods"); !regexp.MustCompile(`"complete":\s*true`).MatchString(body) {
			return "not complete: " + body
		}
		return ""
	})
	redis.Restart()
	wait.Until(t, "the pod incomplete after Redis restarted empty", func() string {
		if _, body := d.Get("/v1/pods"); !regexp.MustCompile(`"incomplete_reason":\s*"index_lost"`).MatchString(body) {
			return "/v1/pods: " + body
		}
		if v := d.Metric(`kvindexd_index_lost_total{reason="restart"}`); v < 1 {
			return fmt.Sprintf("kvindexd_index_lost_total{reason=\"restart\"} %v", v)
		}
		return ""
	})
	// Issue 35: the score answer itself says the index is rebuilding (the
	// pod list is empty: Redis lost the pod's entries), over HTTP and gRPC.
	req, _ := json.Marshal(map[string]any{"model": model, "token_ids": toks})
	if code, body, _ := d.Do("POST", "/v1/score", string(req)); code != http.StatusOK ||
		!regexp.MustCompile(`"index_rebuilding_pods":1\b`).MatchString(body) {
		t.Errorf("score after the loss: %d %s, want index_rebuilding_pods 1", code, body)
	}
	ic, _ := grpcClient(t, d)
	if resp, err := ic.Score(context.Background(), &kvindexv1.ScoreRequest{Model: model, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: toks}}}); err != nil ||
		resp.GetIndexRebuildingPods() != 1 {
		t.Errorf("gRPC score after the loss: %v, %v; want index_rebuilding_pods 1", resp, err)
	}
	// An in-order batch rebuilds only what it carries: still incomplete.
	more := prompt(32, 1)
	publish(t, pub, "pod-lost", model, 1, stored(engineHashes(t, more), more))
	wait.Until(t, "the next batch applied", func() string {
		if got := d.ScoreTokens(model, more)["pod-lost"]; got != 1 {
			return fmt.Sprintf("pod-lost scores %d on its new block", got)
		}
		return ""
	})
	if _, body := d.Get("/v1/pods"); regexp.MustCompile(`"complete":\s*true`).MatchString(body) {
		t.Fatalf("a pod rebuilt from later events only says complete: %s", body)
	}
}
