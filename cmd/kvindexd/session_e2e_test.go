package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestSessionAffinity drives the daemon with vLLM's map-form BlockStored
// carrying session_id (PR #51381) beside keys it does not know
// (event_version) or only carries (ownership), as hack/kvpublisher.py
// writes them: the events apply, and a score or pick naming the session
// prefers its pod when prefixes tie, over HTTP and gRPC.
func TestSessionAffinity(t *testing.T) {
	e := startInProcess(t, func(c *Config) { c.AdminAPI = true })
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 3*e2eBlock)
	for i := range tokens {
		tokens[i] = uint32(900 + 5*i)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	pubA := pypub.StartPublisher(t, e.bind, false)
	pubB := pypub.StartPublisher(t, e.bind, false)
	pubA.WaitReady(waitLimit)
	pubB.WaitReady(waitLimit)
	pubA.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "GPU")}})
	evB := stored(keys, tokens, 0, 2, "GPU")
	evB.SessionID, evB.Ownership, evB.ExtraFields = "agent-42", "tier-2", map[string]any{"event_version": 2}
	pubB.Send(pypub.Batch{Topic: "kv@pod-b@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0), Events: []pypub.Event{evB}})
	q := query{model: e2eModel, tokens: tokens}
	e.expect("both applied, tie by name", q, "pod-a=2 pod-b=2")

	body := func(session string) string {
		b, _ := json.Marshal(map[string]any{"model": e2eModel, "token_ids": tokens, "session_id": session})
		return string(b)
	}
	code, out := e.do("POST", "/v1/score", body("agent-42"))
	var sc struct {
		Pods []struct {
			Pod     string `json:"pod"`
			Session bool   `json:"session"`
		} `json:"pods"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(out), &sc) != nil || len(sc.Pods) != 2 ||
		sc.Pods[0].Pod != "pod-b" || !sc.Pods[0].Session || sc.Pods[1].Session {
		t.Fatalf("score with session: %d %s", code, out)
	}
	g, err := e.grpc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: e2eModel, SessionId: "agent-42",
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: tokens}}})
	if err != nil || len(g.Pods) != 2 || g.Pods[0].Pod != "pod-b" || !g.Pods[0].Session {
		t.Fatalf("gRPC score with session: %v %v", g, err)
	}

	pick := func(session string) string {
		b, _ := json.Marshal(map[string]any{"model": e2eModel, "token_ids": tokens, "session_id": session,
			"candidates": []map[string]any{{"pod": "pod-a"}, {"pod": "pod-b"}}})
		code, out := e.do("POST", "/v1/pick", string(b))
		var p struct{ Pod string }
		if code != http.StatusOK || json.Unmarshal([]byte(out), &p) != nil {
			t.Fatalf("pick: %d %s", code, out)
		}
		return p.Pod
	}
	// (one pick only: a pick makes its pod hold the request speculatively,
	// which would break the tie for the next one)
	if got := pick("agent-42"); got != "pod-b" {
		t.Fatalf("pick with session: %s", got)
	}
}
