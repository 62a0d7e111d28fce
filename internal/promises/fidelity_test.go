package promises

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// seededHashes are the block hashes of a vLLM engine started with
// PYTHONHASHSEED=seed (the daemon's default --hash-seed is another): a
// parity mismatch, so the daemon indexes the pod under its own keys.
func seededHashes(t testing.TB, seed string, tokens []uint32) []uint64 {
	t.Helper()
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: seed, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		out = append(out, uint64(k))
	}
	return out
}

type pickAnswer struct {
	Pod        string `json:"pod"`
	Candidates []struct {
		Pod               string `json:"pod"`
		MatchedBlocks     int    `json:"matched_blocks"`
		SpeculativeBlocks int    `json:"speculative_blocks"`
	} `json:"candidates"`
}

func pickTokens(t *testing.T, d *harness.Daemon, tokens []uint32, pods ...string) pickAnswer {
	t.Helper()
	var cands []map[string]any
	for _, p := range pods {
		cands = append(cands, map[string]any{"pod": p, "events": true})
	}
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": tokens, "candidates": cands})
	code, out, _ := d.Do("POST", "/v1/pick", string(body))
	if code != 200 {
		t.Fatalf("pick: %d %s", code, out)
	}
	var a pickAnswer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("pick answer %s: %v", out, err)
	}
	return a
}

// Issue 32: Pick's speculative entries follow the engine's events for a pod
// whose engine hashes differ from the daemon's (its PYTHONHASHSEED is not
// --hash-seed; the daemon keys it by its own keys). The engine's BlockStored
// answers the entries (kvindexd_pick_assumed_entries{store="speculative"}
// back to 0), and after its BlockRemoved Pick says what Score says: nothing
// held. Before, the entries were dropped by the engine's hashes, matched
// nothing and lived the whole TTL: Pick said 10 matched (10 speculative)
// where Score and the engine said 0. The TTL is raised so that only the
// events can drop the entries within the test.
func TestPromiseSpeculationFollowsEngineEvents(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--speculative-ttl", "1m")
	pub := d.Publisher()
	toks := prompt(32, 10)
	eh := seededHashes(t, "1234", toks)
	if eh[0] == engineHashes(t, toks)[0] {
		t.Fatal("the engine's hashes equal the daemon's: no mismatch to test")
	}
	if a := pickTokens(t, d, toks, "odd"); a.Pod != "odd" {
		t.Fatalf("picked %q", a.Pod)
	}
	waitMetric(t, d, `kvindexd_pick_assumed_entries{store="speculative"}`, 10)
	publish(t, pub, "odd", model, 0, stored(eh, toks))
	wait.Until(t, "the engine's blocks scored by token ids", func() string {
		if got := d.ScoreTokens(model, toks)["odd"]; got != 10 {
			return fmt.Sprintf("odd scores %d of 10", got)
		}
		return ""
	})
	waitMetric(t, d, `kvindexd_pick_assumed_entries{store="speculative"}`, 0)
	publish(t, pub, "odd", model, 1, &event.Batch{Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: eh}}})
	wait.Until(t, "the eviction applied", func() string {
		if s := d.ScoreTokens(model, toks); len(s) != 0 {
			return fmt.Sprintf("still scored: %v", s)
		}
		return ""
	})
	a := pickTokens(t, d, toks, "odd", "other")
	for _, c := range a.Candidates {
		if c.Pod == "odd" && (c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0) {
			t.Fatalf("after the engine evicted everything Score says 0 but Pick says %d matched (%d speculative)",
				c.MatchedBlocks, c.SpeculativeBlocks)
		}
	}
}
