package kvevents

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/vmihailenco/msgpack/v5"
)

// realisticBatch is one busy engine step: a request's 32 new full blocks of
// 16 tokens (512 tokens, hashes spread over the whole uint64 range so most
// take 9 bytes, as vLLM's do) and 16 evictions.
func realisticBatch() (*event.Batch, int) {
	const blocks, bs = 32, 16
	b := &event.Batch{DPRank: 0, Timestamp: 1.7e9}
	st := event.Event{Kind: event.BlockStored, BlockSize: bs, HasParent: true, ParentHash: 0x9e3779b97f4a7c15, Medium: event.TierGPU}
	x := uint64(0x243f6a8885a308d3)
	for i := 0; i < blocks; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		st.BlockHashes = append(st.BlockHashes, x)
		for j := 0; j < bs; j++ {
			st.TokenIDs = append(st.TokenIDs, uint32((x>>uint(j))%151000))
		}
	}
	rm := event.Event{Kind: event.BlockRemoved, Medium: event.TierGPU}
	for i := 0; i < 16; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		rm.BlockHashes = append(rm.BlockHashes, x)
	}
	b.Events = []event.Event{st, rm}
	return b, blocks + 16
}

// BenchmarkDecodeVLLM measures decode throughput in block hashes per second
// (the hashes/s metric) for realistic vLLM batches in each wire form.
func BenchmarkDecodeVLLM(b *testing.B) {
	for _, tc := range []struct {
		name string
		opt  enginepub.VLLMEncodeOptions
	}{
		{"array_int", enginepub.VLLMEncodeOptions{}},
		{"map_int", enginepub.VLLMEncodeOptions{MapForm: true}},
		{"map_bytes32", enginepub.VLLMEncodeOptions{MapForm: true, BytesHashes: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			batch, hashes := realisticBatch()
			p, err := enginepub.EncodeVLLMBatch(batch, tc.opt)
			if err != nil {
				b.Fatal(err)
			}
			var out event.Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := Decode(p, blockkeys.EngineVLLM, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(hashes)*float64(b.N)/b.Elapsed().Seconds(), "hashes/s")
		})
	}
}

// BenchmarkDecodeVLLMGeneric is the baseline the hand-written decoder is
// measured against: vmihailenco/msgpack's generic decoding of the same
// payload into interface values (what a reflection-based decoder costs
// before even converting to event.Event).
func BenchmarkDecodeVLLMGeneric(b *testing.B) {
	batch, hashes := realisticBatch()
	p, err := enginepub.EncodeVLLMBatch(batch, enginepub.VLLMEncodeOptions{MapForm: true})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var v any
		if err := msgpack.Unmarshal(p, &v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(hashes)*float64(b.N)/b.Elapsed().Seconds(), "hashes/s")
}

// decodeApplyStream is one engine's steady state as payloads: batch i stores
// chunk i (32 new blocks of 16 tokens, chained to chunk i-1 as vLLM chains
// them, hashes computed by the same hasher so the parity check matches) and
// evicts the last 16 blocks of chunk i-8, so the index stays bounded while
// the benchmark cycles through the payloads.
func decodeApplyStream(b *testing.B, h *blockkeys.Hasher, withTokens bool) (payloads [][]byte, blocksPerBatch int) {
	return decodeApplyStreamSeed(b, h, withTokens, 0x243f6a8885a308d3)
}

// decodeApplyStreamSeed is decodeApplyStream with its tokens drawn from
// seed, so engines given different seeds store different blocks.
func decodeApplyStreamSeed(b *testing.B, h *blockkeys.Hasher, withTokens bool, seed uint64) (payloads [][]byte, blocksPerBatch int) {
	const chunks, perChunk, evict, lag, bs = 64, 32, 16, 8, 16
	tokens := make([]uint32, chunks*perChunk*bs)
	x := seed
	for i := range tokens {
		x = x*6364136223846793005 + 1442695040888963407
		tokens[i] = uint32((x >> 33) % 151000)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	for c := 0; c < chunks; c++ {
		st := event.Event{Kind: event.BlockStored, BlockSize: bs, Medium: event.TierGPU}
		for _, k := range keys[c*perChunk : (c+1)*perChunk] {
			st.BlockHashes = append(st.BlockHashes, uint64(k))
		}
		if c > 0 {
			st.ParentHash, st.HasParent = uint64(keys[c*perChunk-1]), true
		}
		if withTokens {
			st.TokenIDs = tokens[c*perChunk*bs : (c+1)*perChunk*bs]
		}
		old := (c - lag + chunks) % chunks
		rm := event.Event{Kind: event.BlockRemoved, Medium: event.TierGPU}
		for _, k := range keys[(old+1)*perChunk-evict : (old+1)*perChunk] {
			rm.BlockHashes = append(rm.BlockHashes, uint64(k))
		}
		p, err := enginepub.EncodeVLLMBatch(&event.Batch{Timestamp: 1.7e9, Events: []event.Event{st, rm}}, enginepub.VLLMEncodeOptions{MapForm: true})
		if err != nil {
			b.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	return payloads, perChunk + evict
}

// BenchmarkDecodeApply is the write path after the socket: Decode then the
// applier.Applier into the in-memory index, in block keys (stored + removed)
// per second. with_tokens carries token ids, so the applier re-hashes every
// stored block (live parity check, sha256); without them the engine's hashes
// are used as they are.
func BenchmarkDecodeApply(b *testing.B) {
	decodeApplyModes(b, func(b *testing.B, withTokens bool, h *blockkeys.Hasher, hs *blockkeys.HasherSet) {
		payloads, blocks := decodeApplyStream(b, h, withTokens)
		m := applier.NewMetrics(nil)
		ap, err := applier.New(applier.Config{Index: kvindex.NewMemoryIndex(kvindex.MemoryConfig{}),
			Interner: kvindex.NewInterner(), Hashers: hs, Metrics: m})
		if err != nil {
			b.Fatal(err)
		}
		var batch event.Batch
		step := func(i int) {
			if err := decodeApplyOne(context.Background(), ap, payloads[i%len(payloads)], "pod-0", uint64(i), &batch); err != nil {
				b.Fatal(err)
			}
		}
		for i := range payloads { // warm up: index, digest cache and buffers at steady state
			step(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			step(i)
		}
		b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
		b.StopTimer()
		st := ap.PodStats()
		if len(st) != 1 || st[0].IndexErrors != 0 || st[0].ParityMismatches != 0 || (withTokens && st[0].ParityMatches == 0) {
			b.Fatalf("applier did not take the batches as valid: %+v", st)
		}
	})
}

// decodeApplyModes runs f as the sub-benchmarks with_tokens and
// without_tokens of the DecodeApply benchmarks, with the key config's
// hasher (to build the engine's stream) and hasher set (for the applier).
func decodeApplyModes(b *testing.B, f func(b *testing.B, withTokens bool, h *blockkeys.Hasher, hs *blockkeys.HasherSet)) {
	for _, withTokens := range []bool{true, false} {
		name := "without_tokens"
		if withTokens {
			name = "with_tokens"
		}
		b.Run(name, func(b *testing.B) {
			cfg := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
			h, err := blockkeys.NewHasher(cfg)
			if err != nil {
				b.Fatal(err)
			}
			hs, err := blockkeys.NewHasherSet(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			f(b, withTokens, h, hs)
		})
	}
}

// decodeApplyOne is one engine step after the socket: decode p into batch,
// name it as the subscriber does, apply it.
func decodeApplyOne(ctx context.Context, ap *applier.Applier, p []byte, pod string, seq uint64, batch *event.Batch) error {
	if _, err := Decode(p, blockkeys.EngineVLLM, batch); err != nil {
		return err
	}
	batch.Pod, batch.Model, batch.Engine, batch.Seq = pod, "bench/model", blockkeys.EngineVLLM, seq
	ap.Apply(ctx, batch)
	return nil
}

// BenchmarkHandleMessage is a socket reader's share of one live message:
// frame checks, decode, sequence check and queueing (no apply), the path
// every engine step takes before its stream's worker sees it.
func BenchmarkHandleMessage(b *testing.B) {
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{Workers: 1, QueueSize: 1024}, discardSink{}, m, nil)
	if err != nil {
		b.Fatal(err)
	}
	q := s.dispatcher.queues[0]
	batch, _ := realisticBatch()
	p, err := enginepub.EncodeVLLMBatch(batch, enginepub.VLLMEncodeOptions{MapForm: true})
	if err != nil {
		b.Fatal(err)
	}
	src := &source{addr: "bench", msgs: m.MessagesReceived.WithLabelValues("connect")}
	topic := []byte("kv@pod-bench@m")
	var seq [8]byte
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		s.handle(ctx, src, [][]byte{topic, seq[:], p})
		if len(q.slots) == s.dispatcher.share.batches { // the stream's share is full: stand in for the worker, inline so the reader's cost is all that is timed
			for it, ok := q.pop(); ok; it, ok = q.pop() {
				s.dispatcher.budget.give(batchBytes(standIn(it)))
			}
		}
	}
	b.StopTimer()
	if st := s.Streams()[0]; st.SeqGaps != 0 || st.Overflows != 0 {
		b.Fatalf("stream %+v", st)
	}
}

type discardSink struct{}

func (discardSink) Apply(context.Context, *event.Batch) event.ApplyOutcome {
	return event.ApplyOutcome{}
}
func (discardSink) ForgetPod(context.Context, string, int) {}
