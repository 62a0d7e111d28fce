package promises

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
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

// Issue 32: vLLM's offloading connector announces a hash once per chunk
// holding it and asks consumers to reference-count
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py). Its
// events, as hack/gen_offload_vectors.py generates them from that source
// (kvevents/testdata/offload), go to the daemon over ZMQ: two requests
// sharing 3 blocks, 2 blocks per chunk, the first request's second chunk
// evicted, then a placeholder chunk (one block named) stored and evicted.
// The second request then scores 4 of 4 on the CPU (before: 2, the shared
// block removed with the first chunk), the first 3 of 4. The vectors use
// block size 4, the daemon's default is 16: they are scored by their hashes
// (indexed as published when the block size differs).
func TestPromiseOffloadRefcounts(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	pub := d.Publisher()
	dir := filepath.Join(harness.RepoRoot(t), "kvevents", "testdata", "offload")
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		Steps []struct {
			Name string   `json:"name"`
			CPU  []uint64 `json:"cpu"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(raw, &man); err != nil || len(man.Steps) != 5 {
		t.Fatalf("manifest: %v (%d steps)", err, len(man.Steps))
	}
	for i, st := range man.Steps {
		payload, err := os.ReadFile(filepath.Join(dir, st.Name+".msgpack"))
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("kv@pod-off@"+model, uint64(i), payload); err != nil {
			t.Fatal(err)
		}
	}
	const events = 6 // 2 stores, 1 store, 1 removal, 1 placeholder store, 1 removal
	wait.Until(t, "the connector's events applied", func() string {
		if p, _ := d.Pod("pod-off"); p.EventsApplied != events {
			return fmt.Sprintf("%d events applied, want %d", p.EventsApplied, events)
		}
		return ""
	})
	a := man.Steps[0].CPU // a0..a3
	b := man.Steps[4].CPU // a0, a1, a2, b3: what the CPU holds at the end
	if got := d.Scores(map[string]any{"model": model, "block_hashes": b})["pod-off"]; got != 4 {
		t.Errorf("request B scores %d of 4 blocks on the CPU, want 4: the engine holds them all", got)
	}
	if got := d.Scores(map[string]any{"model": model, "block_hashes": a})["pod-off"]; got != 3 {
		t.Errorf("request A scores %d of 4 blocks, want 3 (its last chunk evicted, its shared block held by B's)", got)
	}
	if p, _ := d.Pod("pod-off"); p.Blocks != 4 {
		t.Errorf("pod-off holds %d entries, want 4", p.Blocks)
	}
}

// scoreState is one pod's entry in a /v1/score answer.
type scoreState struct {
	Matched  int
	Complete bool
	Reason   string
}

func scoreStates(t *testing.T, d *harness.Daemon, tokens []uint32) map[string]scoreState {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": tokens})
	code, out, _ := d.Do("POST", "/v1/score", string(body))
	if code != 200 {
		t.Fatalf("score: %d %s", code, out)
	}
	var ans struct {
		Pods []struct {
			Pod              string `json:"pod"`
			MatchedBlocks    int    `json:"matched_blocks"`
			Complete         bool   `json:"complete"`
			IncompleteReason string `json:"incomplete_reason"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(out), &ans); err != nil {
		t.Fatalf("score answer %s: %v", out, err)
	}
	res := map[string]scoreState{}
	for _, p := range ans.Pods {
		res[p.Pod] = scoreState{p.MatchedBlocks, p.Complete, p.IncompleteReason}
	}
	return res
}

func pyStored(topic string, seq uint64, t *testing.T, tokens []uint32) pypub.Batch {
	return pypub.Batch{Topic: topic, Seq: seq, Form: "map", Events: []pypub.Event{{Type: "BlockStored",
		BlockHashes: engineHashes(t, tokens), TokenIDs: tokens, BlockSize: blockSize, Medium: "GPU"}}}
}

// waitScore waits until the pod's score entry is want.
func waitScore(t *testing.T, d *harness.Daemon, what, pod string, tokens []uint32, want scoreState) {
	t.Helper()
	wait.Until(t, what, func() string {
		if got := scoreStates(t, d, tokens)[pod]; got != want {
			return fmt.Sprintf("%s scores %+v, want %+v", pod, got, want)
		}
		return ""
	})
}

// Issue 32: an engine killed with SIGKILL (a real libzmq publisher,
// hack/kvpublisher.py) kept its blocks scored as complete until its first
// event after a restart: the dropped connection was not used. The
// connection's end now marks its pods `complete:false`,
// `incomplete_reason:"disconnected"` at once, in both topologies (the
// engine connects to the daemon's bind; the daemon connects to the engine's
// bind), and the blocks stay scored, flagged, until the pod expiry
// (--pod-expiry, 1 h) or the engine's next batch. A publisher that comes
// back and continues its sequence (nothing was lost) makes the pod complete
// again; one that restarts at seq 0 clears it and is complete from there.
func TestPromiseDeadEngineIsIncomplete(t *testing.T) {
	t.Parallel()
	pypub.RequirePython(t)
	engPort := harness.FreePort(t)
	engAddr := fmt.Sprintf("tcp://127.0.0.1:%d", engPort)
	d := harness.Start(t, "--endpoint", engAddr+",pod=pod-bind,model="+model)
	toks := prompt(41, 4)
	complete := scoreState{Matched: 4, Complete: true}
	dead := scoreState{Matched: 4, Reason: "disconnected"}

	t.Run("engine connects to the daemon", func(t *testing.T) {
		const topic = "kv@pod-conn@" + model
		pub := pypub.StartPublisher(t, d.ZMQ, false)
		pub.WaitReady(wait.Limit)
		pub.Send(pyStored(topic, 0, t, toks))
		waitScore(t, d, "stored", "pod-conn", toks, complete)
		pub.Kill()
		waitScore(t, d, "the killed engine's pod incomplete", "pod-conn", toks, dead)
		// It comes back and continues its sequence: nothing was lost.
		again := pypub.StartPublisher(t, d.ZMQ, false)
		again.WaitReady(wait.Limit)
		more := prompt(42, 2)
		again.Send(pyStored(topic, 1, t, more))
		waitScore(t, d, "complete again after the next seq", "pod-conn", toks, complete)
		again.Close()
	})

	t.Run("daemon connects to the engine", func(t *testing.T) {
		const topic = "kv@pod-bind@" + model
		pub := pypub.StartPublisher(t, engAddr, true)
		pub.WaitReady(wait.Limit)
		pub.Send(pyStored(topic, 0, t, toks[:2*blockSize]))
		pub.Send(pyStored(topic, 1, t, toks)) // seq 1: the restart below is a jump back
		waitScore(t, d, "stored", "pod-bind", toks, complete)
		pub.Kill()
		waitScore(t, d, "the killed engine's pod incomplete", "pod-bind", toks, dead)
		// The engine restarts (seq 0) on the same address; the daemon
		// redials: the pod is cleared and complete from seq 0.
		again := pypub.StartPublisher(t, engAddr, true)
		again.WaitReady(wait.Limit)
		fresh := prompt(43, 3)
		again.Send(pyStored(topic, 0, t, fresh))
		waitScore(t, d, "the restarted engine complete", "pod-bind", fresh, scoreState{Matched: 3, Complete: true})
		if s, ok := scoreStates(t, d, toks)["pod-bind"]; ok {
			t.Errorf("the restarted engine's old blocks still scored: %+v", s)
		}
		again.Close()
	})
}

// Issue 32: an SGLang pod is indexed under SGLang's page hashes, and the
// speculative entries Pick holds for it are too: its own BlockStored and
// BlockRemoved, sent over ZMQ in SGLang's format, drop them (before, they
// were held under vLLM's keys, which no SGLang event names, and lived the
// full TTL), and after its eviction Pick matches what Score matches.
func TestPromiseSpeculationFollowsSGLangEvents(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--bind-engine", "sglang", "--speculative-ttl", "1m")
	pub := d.Publisher()
	toks := prompt(33, 10)
	hs, err := blockkeys.NewHasherSet(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: blockkeys.DefaultSeed, BlockSize: blockSize}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sg []uint64
	for _, k := range hs.ForEngine(model, blockkeys.EngineSGLang).Keys(nil, toks, blockkeys.RequestExtras{}) {
		sg = append(sg, uint64(k))
	}
	if sg[0] == engineHashes(t, toks)[0] {
		t.Fatal("SGLang's hashes equal vLLM's: nothing to test")
	}
	send := func(seq uint64, b *event.Batch) {
		t.Helper()
		payload, err := enginepub.EncodeSGLangBatch(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("kv@sg@"+model, seq, payload); err != nil {
			t.Fatal(err)
		}
	}
	scores := func(want int) {
		t.Helper()
		wait.Until(t, "the SGLang pod's blocks scored", func() string {
			if got := d.ScoreTokens(model, toks)["sg"]; got != want {
				return fmt.Sprintf("sg scores %d, want %d", got, want)
			}
			return ""
		})
	}
	send(0, stored(sg[:2], toks[:2*blockSize]))
	scores(2)
	if a := pickTokens(t, d, toks, "sg"); a.Pod != "sg" {
		t.Fatalf("picked %q", a.Pod)
	}
	waitMetric(t, d, `kvindexd_pick_assumed_entries{store="speculative"}`, 8)
	rest := stored(sg[2:], toks[2*blockSize:])
	rest.Events[0].ParentHash, rest.Events[0].HasParent = sg[1], true
	send(1, rest)
	scores(10)
	waitMetric(t, d, `kvindexd_pick_assumed_entries{store="speculative"}`, 0)
	send(2, &event.Batch{Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: sg}}})
	scores(0)
	a := pickTokens(t, d, toks, "sg", "other")
	for _, c := range a.Candidates {
		if c.Pod == "sg" && (c.MatchedBlocks != 0 || c.SpeculativeBlocks != 0) {
			t.Fatalf("after the SGLang pod evicted everything Score says 0 but Pick says %d matched (%d speculative)",
				c.MatchedBlocks, c.SpeculativeBlocks)
		}
	}
}
