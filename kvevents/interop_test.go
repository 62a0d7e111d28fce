package kvevents

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Interop tests drive hack/kvpublisher.py: real libzmq (Debian python3-zmq)
// and the reference msgpack implementation (python3-msgpack), publishing the
// way vLLM, SGLang and TensorRT-LLM do. They skip only when /usr/bin/python3 lacks those
// modules; set KVINDEX_REQUIRE_INTEROP=1 (CI does) to fail instead.

func requireInterop(t *testing.T) {
	t.Helper()
	if err := exec.Command(pypub.Python, "-c", "import zmq, msgpack").Run(); err != nil {
		msg := fmt.Sprintf("!!! INTEROP TEST NOT RUN: %s cannot import zmq and msgpack (%v); "+
			"install python3-zmq python3-msgpack (apt-get install -y python3-zmq python3-msgpack)", pypub.Python, err)
		if os.Getenv("KVINDEX_REQUIRE_INTEROP") != "" {
			t.Fatal(msg)
		}
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
}

// startPy starts hack/kvpublisher.py (through the e2e driver) and waits
// until a subscriber is attached.
func startPy(t *testing.T, args ...string) *pypub.Publisher {
	t.Helper()
	p := pypub.StartPublisherArgs(t, args...)
	p.WaitReady(testTimeout)
	return p
}

type obj = map[string]any

// Central topology: kvindex binds, the (real libzmq) engine connects.
// Covers array and map forms, int hashes of every size and sign, bytes
// hashes, every BlockStored field, DP ranks and a malformed message.
func TestInteropCentralTopology(t *testing.T) {
	requireInterop(t)
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, m)
	py := startPy(t, "--endpoint", s.BindAddr(), "--mode", "connect")

	const topic = "kv@pod-py@Qwen/Qwen3-0.6B"
	py.SendJSON(obj{"topic": topic, "seq": 0, "form": "array", "ts": 10.5, "dp_rank": 0, "events": []obj{{
		"type": "BlockStored", "block_hashes": []any{uint64(3236607068019569386), uint64(18446744073709551615), -5, 7},
		"parent_block_hash": nil, "token_ids": []int{1, 2, 3, 4, 5, 6, 70000, 2147483648}, "block_size": 2,
		"medium": "GPU", "lora_name": "sql-lora", "lora_id": 3,
		"extra_keys": []any{[]any{"sql-lora", 5, []any{"img", 1}}, nil, nil, nil}, "group_idx": 1}}})
	py.SendJSON(obj{"topic": topic, "seq": 1, "form": "map", "bytes_hashes": true, "events": []obj{
		{"type": "BlockStored", "block_hashes": []any{1, uint64(1) << 63}, "parent_block_hash": 99,
			"token_ids": []int{7, 8, 9, 10}, "block_size": 2, "medium": "CPU_PINNED"},
		{"type": "BlockRemoved", "block_hashes": []any{7}, "medium": nil}}})
	// a 16-byte (xxh3-128) digest given as hex; dp_rank nil
	py.SendJSON(obj{"topic": topic, "seq": 2, "form": "map", "dp_rank": nil, "events": []obj{
		{"type": "BlockRemoved", "block_hashes": []any{"00112233445566778899aabbccddeeff"}, "medium": "disk"}}})
	py.SendJSON(obj{"raw_frames": []string{"6b7640706f642d7079"}}) // one frame: dropped
	py.SendJSON(obj{"topic": topic, "seq": 0, "form": "array", "dp_rank": 2, "events": []obj{{"type": "AllBlocksCleared"}}})
	py.Close()

	bs := sink.waitFor(t, "4 batches", func(bs []*event.Batch) bool { return len(bs) == 4 })
	var rank0 []*event.Batch
	for _, b := range bs {
		if b.Pod != "pod-py" || b.Model != "Qwen/Qwen3-0.6B" || b.Engine != blockkeys.EngineVLLM {
			t.Fatalf("batch identity %+v", b)
		}
		if b.DPRank == 0 {
			rank0 = append(rank0, b)
		}
	}
	if len(rank0) != 3 {
		t.Fatalf("rank 0 batches: %s", describe(bs))
	}
	want0 := event.Event{Kind: event.BlockStored,
		BlockHashes: []uint64{3236607068019569386, 18446744073709551615, 0xfffffffffffffffb, 7},
		TokenIDs:    []uint32{1, 2, 3, 4, 5, 6, 70000, 2147483648}, BlockSize: 2, Medium: event.TierGPU,
		LoraName: "sql-lora", LoraID: 3, HasLoraID: true, GroupIdx: 1,
		ExtraKeys: [][]any{{"sql-lora", int64(5), []any{"img", int64(1)}}, nil, nil, nil}}
	if rank0[0].Timestamp != 10.5 || !reflect.DeepEqual(rank0[0].Events, []event.Event{want0}) {
		t.Fatalf("seq 0:\n%+v\nwant\n%+v", rank0[0].Events, want0)
	}
	want1 := []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{1, 1 << 63}, ParentHash: 99, HasParent: true,
			TokenIDs: []uint32{7, 8, 9, 10}, BlockSize: 2, Medium: event.TierCPU},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{7}},
	}
	if !reflect.DeepEqual(rank0[1].Events, want1) {
		t.Fatalf("seq 1:\n%+v\nwant\n%+v", rank0[1].Events, want1)
	}
	want2 := []event.Event{{Kind: event.BlockRemoved, BlockHashes: []uint64{0x8899aabbccddeeff}, Medium: event.TierDisk}}
	if !reflect.DeepEqual(rank0[2].Events, want2) {
		t.Fatalf("seq 2:\n%+v\nwant\n%+v", rank0[2].Events, want2)
	}
	if got := metricValue(m.DroppedFrames.WithLabelValues("frame_count")); got != 1 {
		t.Fatalf("dropped frames %v", got)
	}
	if st := s.Streams(); len(st) != 2 || st[0].SeqGaps+st[1].SeqGaps+st[0].Restarts+st[1].Restarts != 0 {
		t.Fatalf("streams %+v", st)
	}
}

// Per-pod topology: the (real libzmq) engine binds, kvindex connects. A batch
// lost on the live stream is fetched through the replay ROUTER in both reply
// formats, and a restarted publisher (seq back to 0) clears the pod.
func TestInteropPerPodTopologyReplay(t *testing.T) {
	requireInterop(t)
	for _, tc := range []struct {
		name   string
		legacy bool
		form   string
		engine blockkeys.Engine
	}{
		{"vllm_0.26_replay", false, "map", blockkeys.EngineVLLM},
		{"vllm_0.25_replay_sglang", true, "sglang", blockkeys.EngineSGLang},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newCollectSink()
			m := NewMetrics(nil)
			addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			// Catch-up at connect is off: this is the gap path (TestCatchUpAtConnect covers connect).
			s := startSub(t, Config{DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: addr, ReplayAddress: replay, Engine: tc.engine}}}, sink, m)
			args := []string{"--endpoint", addr, "--mode", "bind", "--replay-endpoint", replay}
			if tc.legacy {
				args = append(args, "--replay-legacy")
			}
			py := startPy(t, args...)
			const topic = "kv@pod-rp@m"
			stored := func(seq int, h any, skip bool) obj {
				return obj{"topic": topic, "seq": seq, "form": tc.form, "skip_live": skip, "events": []obj{{
					"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": nil,
					"token_ids": []int{seq, seq}, "block_size": 2, "cache_salt": "salt-1"}}}
			}
			py.SendJSON(stored(0, 100, false))
			py.SendJSON(stored(1, uint64(0xffffffffffffff01), true)) // lost live
			py.SendJSON(stored(2, -2, true))                         // lost live
			py.SendJSON(stored(3, 103, false))
			bs := sink.waitFor(t, "seq 3", hasSeq("pod-rp", 3))
			wantH := []uint64{100, 0xffffffffffffff01, 0xfffffffffffffffe, 103}
			if len(bs) != 4 {
				t.Fatalf("got %s", describe(bs))
			}
			for i, b := range bs {
				if b.Seq != uint64(i) || b.Events[0].BlockHashes[0] != wantH[i] || b.Engine != tc.engine {
					t.Fatalf("batch %d: %+v", i, b)
				}
				if tc.engine == blockkeys.EngineSGLang && b.Events[0].CacheSalt != "salt-1" {
					t.Fatalf("cache_salt lost: %+v", b.Events[0])
				}
			}
			st := s.Streams()[0]
			if st.SeqGaps != 1 || st.MissedBatches != 2 || st.ReplayedBatches != 2 {
				t.Fatalf("stream %+v", st)
			}
			if metricValue(m.Replays.WithLabelValues("ok")) != 1 || metricValue(m.ReplayedBatches) != 2 {
				t.Fatal("replay metrics")
			}
			py.Close()
			if tc.legacy {
				return
			}
			// The engine restarts on the same port: we reconnect and its seq 0
			// clears the pod before its first new batch.
			py2 := startPy(t, "--endpoint", addr, "--mode", "bind")
			py2.SendJSON(stored(0, 200, false))
			py2.Close()
			bs = sink.waitFor(t, "post-restart batch", func(bs []*event.Batch) bool { return len(bs) == 5 })
			if b := bs[4]; b.Seq != 0 || len(b.Events) != 2 || b.Events[0].Kind != event.AllBlocksCleared || b.Events[1].BlockHashes[0] != 200 {
				t.Fatalf("after restart: %s", describe(bs))
			}
			if st := s.Streams()[0]; st.Restarts != 1 {
				t.Fatalf("stream %+v", st)
			}
		})
	}
}
