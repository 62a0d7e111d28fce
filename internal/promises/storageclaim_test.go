package promises

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// docs/security.md, "Storage claims" (issue 35): with default flags no
// publisher speaks for shared storage. One kv@SHARED_STORAGE@<model> batch
// in llm-d's connector form (hack/kvpublisher.py "llmd-storage", real
// libzmq) naming the prompt's 2 blocks is refused and counted: pod-a keeps
// its 1 GPU block, pod-b (publishing for the model, holding none of the
// prompt) stays out of the scores, and Pick stays on pod-a. With the source
// configured (--storage-readers SHARED_STORAGE=*) the same batch credits
// both pods 2 blocks, and Pick still prefers pod-a's own block.
func TestPromiseStorageClaims(t *testing.T) {
	t.Parallel()
	toks := prompt(35, 2)
	hs := engineHashes(t, toks)
	for _, tc := range []struct {
		name       string
		flags      []string
		wantScores string
		refused    float64
	}{
		{"default flags", nil, "map[pod-a:1]", 1},
		{"configured source", []string{"--storage-readers", "SHARED_STORAGE=*"}, "map[pod-a:2 pod-b:2]", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := harness.Start(t, tc.flags...)
			pub := d.Publisher()
			publish(t, pub, "pod-a", model, 0, stored(hs[:1], toks[:blockSize]))
			other := prompt(36, 1)
			publish(t, pub, "pod-b", model, 0, stored(engineHashes(t, other), other))
			wait.Until(t, "pods indexed", func() string {
				if len(d.Pods()) != 2 {
					return fmt.Sprintf("pods %+v", d.Pods())
				}
				return ""
			})
			score := func() string { return fmt.Sprint(d.ScoreTokens(model, toks)) }
			if got := score(); got != "map[pod-a:1]" {
				t.Fatalf("before the claim: %s", got)
			}
			if got := pick(t, d, hs); got != "pod-a" {
				t.Fatalf("pick before the claim: %s", got)
			}

			sp := pypub.StartPublisher(t, d.ZMQ, false)
			sp.WaitReady(harness.ReadyLimit)
			sp.Send(pypub.Batch{Topic: "kv@SHARED_STORAGE@" + model, Seq: 1, Form: "llmd-storage",
				Events: []pypub.Event{{Type: "BlockStored", BlockHashes: hs}}})
			wait.Until(t, "the claim handled", func() string {
				if n := d.Metric("kvindexd_storage_claims_refused_total"); n != tc.refused {
					return fmt.Sprintf("refused %v, want %v", n, tc.refused)
				}
				if got := score(); got != tc.wantScores {
					return "scores " + got
				}
				return ""
			})
			if got := pick(t, d, hs); got != "pod-a" {
				t.Fatalf("pick after the claim: %s, want pod-a", got)
			}
			for _, p := range d.Pods() {
				if p.Pod == "SHARED_STORAGE" {
					t.Fatalf("the storage listed as a pod: %+v", p)
				}
			}
		})
	}
}

// pick is POST /v1/pick's pod among pod-b and pod-a, both idle (pod-b first,
// so a tie would go to it).
func pick(t *testing.T, d *harness.Daemon, hashes []uint64) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "block_hashes": hashes,
		"candidates": []map[string]any{{"pod": "pod-b"}, {"pod": "pod-a"}}})
	code, body, _ := d.Do("POST", "/v1/pick", string(b))
	var out struct {
		Pod string `json:"pod"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("/v1/pick: %d %s", code, body)
	}
	return out.Pod
}

// docs/security.md, "Storage claims" (issue 35): a refused storage claim
// takes no stream slot. With --max-streams 1 a kv@SHARED_STORAGE@<model>
// batch (default flags otherwise: no source configured) comes first and is
// refused; pod-a's batch after it still gets the one stream. Before, the
// refused claim's stream was admitted and held the slot, so pod-a was
// dropped (stream_limit) and never indexed.
func TestPromiseStorageClaimTakesNoStream(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--max-streams", "1")
	pub := d.Publisher()
	toks := prompt(37, 2)
	hs := engineHashes(t, toks)
	publish(t, pub, "SHARED_STORAGE", model, 0, stored(hs, toks))
	wait.Until(t, "the claim refused", func() string {
		if n := d.Metric("kvindexd_storage_claims_refused_total"); n != 1 {
			return fmt.Sprintf("refused %v, want 1", n)
		}
		return ""
	})
	publish(t, pub, "pod-a", model, 0, stored(hs[:1], toks[:blockSize]))
	wait.Until(t, "pod-a indexed in the one stream slot", func() string {
		if got := fmt.Sprint(d.ScoreTokens(model, toks)); got != "map[pod-a:1]" {
			return "scores " + got
		}
		return ""
	})
	if n := d.Metric(`kvindexd_kvevents_dropped_frames_total{reason="stream_limit"}`); n != 0 {
		t.Errorf("%v batches dropped at the stream limit", n)
	}
	if ps := d.Pods(); len(ps) != 1 || ps[0].Pod != "pod-a" {
		t.Errorf("pods %+v, want pod-a alone", ps)
	}
}
