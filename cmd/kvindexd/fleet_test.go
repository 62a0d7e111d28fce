package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// fleetModel is the model the published fleet serves: the name `make run`
// gives the committed Qwen3 tokenizer, so prompt scores work against it.
const fleetModel = "Qwen/Qwen3-8B"

// fleetPrompt is the prompt every pod of the fleet holds a prefix of.
const fleetPrompt = "You are a helpful assistant. Answer briefly and cite your sources. " +
	"The user asks about the weather in Lisbon, Porto and Faro for the coming week, " +
	"and wants a table with the highs, the lows and the chance of rain for every day. " +
	"Use metric units, name the forecast service you relied on, and say how certain each day is. " +
	"If a city has no forecast, write so in its row instead of guessing. Keep the table under " +
	"twenty lines, put the warmest day in bold, and end with one sentence of advice on what to pack " +
	"for a walking holiday that visits all three cities, starting in the north and ending in the south."

// fleetPod is one engine of the published fleet: how many leading blocks of
// the prompt it holds, on which tier, from which DP rank.
type fleetPod struct {
	name   string
	rank   int
	blocks int
	tier   event.Tier
}

// publishFleet publishes a small fleet of vLLM engines through the daemon's
// bind socket (real ZMQ over loopback) and waits until every batch is
// applied: pod-a holds the whole prompt on GPU, pod-b half of it on CPU,
// pod-c two DP ranks, pod-d one block, and one of pod-d's removals names a
// block it never stored. It returns the prompt's token ids.
func publishFleet(t *testing.T, e *e2eDaemon, tokens []uint32) []fleetPod {
	t.Helper()
	pods := []fleetPod{
		{"10.0.0.1:8000", 0, len(tokens) / e2eBlock, event.TierGPU},
		{"10.0.0.2:8000", 0, len(tokens) / e2eBlock / 2, event.TierCPU},
		{"10.0.0.3:8000", 0, 2, event.TierGPU},
		{"10.0.0.3:8000", 1, 3, event.TierGPU},
		{"10.0.0.4:8000", 0, 1, event.TierDisk},
	}
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	if err != nil {
		t.Fatal(err)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	pub, err := enginepub.NewPublisher(e.bind, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := pub.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatalf("the daemon did not subscribe: %v", err)
	}
	seq := map[string]uint64{}
	for _, p := range pods {
		ev := event.Event{Kind: event.BlockStored, BlockSize: e2eBlock, Medium: p.tier,
			TokenIDs: tokens[:p.blocks*e2eBlock]}
		for _, k := range keys[:p.blocks] {
			ev.BlockHashes = append(ev.BlockHashes, uint64(k))
		}
		evs := []event.Event{ev}
		if p.name == "10.0.0.4:8000" {
			evs = append(evs, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{12345}, Medium: p.tier})
		}
		payload, err := enginepub.EncodeVLLMBatch(&event.Batch{DPRank: p.rank, Timestamp: float64(time.Now().Unix()), Events: evs},
			enginepub.VLLMEncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		topic := "kv@" + p.name + "@" + fleetModel
		seq[topic]++
		if err := pub.Publish(topic, seq[topic], payload); err != nil {
			t.Fatal(err)
		}
	}
	wait.Until(t, "the fleet's events applied", func() string {
		_, body := e.get("/v1/pods")
		var out struct {
			Pods []struct {
				Pod           string `json:"pod"`
				EventsApplied uint64 `json:"events_applied"`
			} `json:"pods"`
		}
		_ = json.Unmarshal([]byte(body), &out)
		applied := 0
		for _, p := range out.Pods {
			if p.EventsApplied > 0 {
				applied++
			}
		}
		if applied == len(pods) {
			return ""
		}
		return "still " + body
	})
	return pods
}
