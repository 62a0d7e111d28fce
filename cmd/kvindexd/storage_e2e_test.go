package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
)

// TestSharedStorageIsATier drives the daemon with llm-d's filesystem offload
// connector's storage events as hack/kvpublisher.py's "llmd-storage" form
// produces them (topic kv@SHARED_STORAGE@<model>, seq from 1, each event a
// msgpack bin of a msgpack array, parent 0, no tokens, unsigned hashes): the
// storage's blocks extend every pod of the model as the shared tier, and
// SHARED_STORAGE is never a pod of a score, a pick or the pod listing.
func TestSharedStorageIsATier(t *testing.T) {
	e := startInProcess(t, func(c *Config) { c.AdminAPI = true; c.StorageReaders = "SHARED_STORAGE=*" })
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 6*e2eBlock)
	for i := range tokens {
		tokens[i] = uint32(500 + 3*i)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	pubA := pypub.StartPublisher(t, e.bind, false)
	pubB := pypub.StartPublisher(t, e.bind, false)
	pubS := pypub.StartPublisher(t, e.bind, false)
	for _, p := range []*pypub.Publisher{pubA, pubB, pubS} {
		p.WaitReady(waitLimit)
	}
	pubA.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "GPU")}})
	pubB.Send(pypub.Batch{Topic: "kv@pod-b@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 1, "GPU")}})
	e.expect("pods alone", query{model: e2eModel, tokens: tokens}, "pod-a=2 pod-b=1")

	// the storage holds blocks 0-4 (one offloaded file each)
	pubS.Send(pypub.Batch{Topic: "kv@SHARED_STORAGE@" + e2eModel, Seq: 1, Form: "llmd-storage",
		Events: []pypub.Event{{Type: "BlockStored", BlockHashes: hashesOf(keys[:5])}}})
	e.expect("storage credited to every pod of the model", query{model: e2eModel, tokens: tokens}, "pod-a=5 pod-b=5")
	e.expect("a filter keeps its readers", query{model: e2eModel, tokens: tokens, pods: []string{"pod-b"}}, "pod-b=5")
	e.expect("the source is not a pod", query{model: e2eModel, tokens: tokens, pods: []string{"SHARED_STORAGE"}}, "")

	code, body := e.do("POST", "/v1/score", `{"model":"`+e2eModel+`","block_hashes":`+jsonOf(hashesOf(keys))+`}`)
	var sc struct {
		Pods []struct {
			Pod   string           `json:"pod"`
			Score float64          `json:"score"`
			Tiers map[string]int32 `json:"tiers"`
		} `json:"pods"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &sc) != nil || len(sc.Pods) != 2 {
		t.Fatalf("score: %d %s", code, body)
	}
	// pod-a: 2 GPU + 3 shared; pod-b: 1 GPU + 4 shared (shared weighs 0.4)
	if p := sc.Pods[0]; p.Pod != "pod-a" || p.Tiers["gpu"] != 2 || p.Tiers["shared"] != 3 || p.Score < 3.19 || p.Score > 3.21 {
		t.Fatalf("pod-a: %+v (%s)", p, body)
	}
	if p := sc.Pods[1]; p.Pod != "pod-b" || p.Tiers["gpu"] != 1 || p.Tiers["shared"] != 4 {
		t.Fatalf("pod-b: %+v (%s)", p, body)
	}

	code, body = e.do("GET", "/v1/pods", "")
	var pods struct {
		Pods    []struct{ Pod string } `json:"pods"`
		Storage []struct {
			Pod    string `json:"pod"`
			Blocks int64  `json:"blocks"`
		} `json:"storage"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &pods) != nil {
		t.Fatalf("pods: %d %s", code, body)
	}
	for _, p := range pods.Pods {
		if p.Pod == "SHARED_STORAGE" {
			t.Fatalf("storage listed as a pod: %s", body)
		}
	}
	if len(pods.Storage) != 1 || pods.Storage[0].Pod != "SHARED_STORAGE" || pods.Storage[0].Blocks != 5 {
		t.Fatalf("storage listing: %s", body)
	}

	// a pick among the readers chooses by the credited runs; the source
	// named as a candidate never matches
	code, body = e.do("POST", "/v1/pick", `{"model":"`+e2eModel+`","block_hashes":`+jsonOf(hashesOf(keys))+
		`,"candidates":[{"pod":"pod-b"},{"pod":"SHARED_STORAGE"}]}`)
	if code != http.StatusOK || !strings.Contains(body, `"pod":"pod-b"`) {
		t.Fatalf("pick: %d %s", code, body)
	}
	var pk struct {
		Candidates []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matched_blocks"`
		} `json:"candidates"`
	}
	if json.Unmarshal([]byte(body), &pk) != nil {
		t.Fatalf("pick: %s", body)
	}
	for _, c := range pk.Candidates {
		if want := map[string]int{"pod-b": 5, "SHARED_STORAGE": 0}[c.Pod]; c.MatchedBlocks != want {
			t.Fatalf("pick candidate %s matched %d, want %d: %s", c.Pod, c.MatchedBlocks, want, body)
		}
	}

	// removals from storage shrink the credit
	pubS.Send(pypub.Batch{Topic: "kv@SHARED_STORAGE@" + e2eModel, Seq: 2, Form: "llmd-storage",
		Events: []pypub.Event{{Type: "BlockRemoved", BlockHashes: hashesOf(keys[3:5])}}})
	e.expect("storage removal", query{model: e2eModel, tokens: tokens}, "pod-a=3 pod-b=3")
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
