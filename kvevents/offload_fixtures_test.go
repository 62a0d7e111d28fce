package kvevents

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

type offloadManifest struct {
	Steps []struct {
		Name string   `json:"name"`
		What string   `json:"what"`
		CPU  []uint64 `json:"cpu"`
	} `json:"steps"`
}

// vLLM's offloading connector announces a hash once per chunk that holds
// it and asks consumers to reference-count stores against removes
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py). The
// payloads in testdata/offload are its events as hack/gen_offload_vectors.py
// generates them from that source (reference block hashing, msgpack packed
// as msgspec does): two requests sharing 3 blocks, 2 blocks per chunk;
// evicting the first request's second chunk leaves the second request's 4
// blocks on the CPU (before, a2 went: 2 of 4). A placeholder chunk (token_ids
// empty, block_size 0) is credited with the one block it names, and its
// removal takes only that block. After every step the pod's CPU tier holds
// exactly the manifest's keys.
func TestOffloadConnectorRefcounts(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "offload", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var man offloadManifest
	if err := json.Unmarshal(raw, &man); err != nil || len(man.Steps) == 0 {
		t.Fatalf("manifest: %v", err)
	}
	env := newFixtureEnv(t)
	ctx := context.Background()
	for i, st := range man.Steps {
		payload, err := os.ReadFile(filepath.Join("testdata", "offload", st.Name+".msgpack"))
		if err != nil {
			t.Fatal(err)
		}
		var b event.Batch
		if _, err := Decode(payload, blockkeys.EngineVLLM, &b); err != nil {
			t.Fatalf("%s: %v", st.Name, err)
		}
		b.Pod, b.Model, b.Seq = "pod-off", "model-a", uint64(i)
		env.sink.Apply(ctx, &b)
		id := env.in.Pod("pod-off", 0)
		for _, k := range st.CPU {
			if !env.holds(t, "model-a", id, event.TierCPU, k) {
				t.Errorf("%s (%s): key %d not held on the CPU", st.Name, st.What, k)
			}
		}
		if n, _ := env.idx.PodBlocks(ctx, id); n != int64(len(st.CPU)) {
			t.Errorf("%s (%s): pod holds %d entries, want exactly %d", st.Name, st.What, n, len(st.CPU))
		}
	}
	p := env.sink.a.PodStats()[0]
	if p.ParityMatches != 6 || p.ParityMismatches != 0 {
		t.Errorf("parity %+v: want the 6 self-describing blocks rehashed and matching", p)
	}
}
