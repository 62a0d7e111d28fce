// Command compare runs the same fixtures through kvindex and
// github.com/llm-d/llm-d-kv-cache and prints each one's time per operation
// and the ratio (theirs / ours). It is a separate module so that the peer
// and its dependencies are never part of kvindex's build or `make test`.
//
//	make compare                      # from the repository root
//	go run . -benchtime 500ms         # from bench/compare
//
// Fixtures: insert (512 keys of one pod per call), lookup+score of a
// 512-block prompt held by 8 and by 64 pods (pod i holds a prefix 512-i*k
// blocks long), hashing an 8k-token prompt, and decoding a vLLM batch of 32
// stored blocks with token ids plus 16 removed. The two hashes are not the
// same function (kvindex computes vLLM's SHA-256 block hashes, the peer its
// own 64-bit chain), so the hashing row compares what each must do to turn
// tokens into keys, not identical work.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	llmdevents "github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

const (
	blocks    = 512
	blockSize = 16
	model     = "compare/model"
)

func main() {
	benchtime := flag.Duration("benchtime", 300*time.Millisecond, "minimum time per measurement")
	flag.Parse()
	testing.Init()
	if err := flag.Set("test.benchtime", benchtime.String()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rows := []struct {
		name        string
		ours, their func(b *testing.B)
	}{
		{"insert 512 keys", oursInsert, theirsInsert},
		{"lookup+score 512 x 8 pods", oursScore(8), theirsScore(8)},
		{"lookup+score 512 x 64 pods", oursScore(64), theirsScore(64)},
		{"hash 8192 tokens (512 blocks)", oursHash, theirsHash},
		{"decode vLLM batch (32+16 blocks)", oursDecode, theirsDecode},
	}
	fmt.Printf("%-34s %14s %14s %8s\n", "fixture", "kvindex", "llm-d-kv-cache", "ratio")
	for _, r := range rows {
		o, t := testing.Benchmark(r.ours), testing.Benchmark(r.their)
		if o.N == 0 || t.N == 0 {
			fmt.Fprintf(os.Stderr, "%s: a benchmark failed\n", r.name)
			os.Exit(1)
		}
		on, tn := float64(o.T.Nanoseconds())/float64(o.N), float64(t.T.Nanoseconds())/float64(t.N)
		fmt.Printf("%-34s %14s %14s %7.1fx\n", r.name, dur(on), dur(tn), tn/on)
	}
}

func dur(ns float64) string { return time.Duration(ns).Round(10 * time.Nanosecond).String() }

func prompt(seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 1))
	t := make([]uint32, blocks*blockSize)
	for i := range t {
		t[i] = uint32(r.IntN(150000))
	}
	return t
}

func ourHasher(b *testing.B) *blockkeys.Hasher {
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "0", BlockSize: blockSize})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

func theirProcessor(b *testing.B) kvblock.TokenProcessor {
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: blockSize, HashSeed: "0"})
	if err != nil {
		b.Fatal(err)
	}
	return tp
}

// promptKeys are 64 prompts' keys: the insert fixture cycles through them.
func promptKeys(n int) [][]uint64 {
	out := make([][]uint64, n)
	for i := range out {
		r := rand.New(rand.NewPCG(uint64(i), 2))
		out[i] = make([]uint64, blocks)
		for j := range out[i] {
			out[i][j] = r.Uint64() | 1
		}
	}
	return out
}

func oursInsert(b *testing.B) {
	idx := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
	in := kvindex.NewInterner()
	m := in.Model(model)
	pods := make([]kvindex.PodID, 8)
	for i := range pods {
		pods[i] = in.Pod(fmt.Sprintf("pod-%d", i), 0)
	}
	ks := promptKeys(64)
	keys := make([][]blockkeys.Key, len(ks))
	for i := range ks {
		for _, k := range ks[i] {
			keys[i] = append(keys[i], blockkeys.Key(k))
		}
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := idx.Add(ctx, m, pods[i%8], event.TierGPU, keys[i%len(keys)]); err != nil {
			b.Fatal(err)
		}
	}
}

func theirsInsert(b *testing.B) {
	idx := theirIndex(b)
	ks := promptKeys(64)
	keys := make([][]kvblock.BlockHash, len(ks))
	for i := range ks {
		for _, k := range ks[i] {
			keys[i] = append(keys[i], kvblock.BlockHash(k))
		}
	}
	entries := make([][]kvblock.PodEntry, 8)
	for i := range entries {
		entries[i] = []kvblock.PodEntry{{PodIdentifier: fmt.Sprintf("pod-%d", i), DeviceTier: "gpu"}}
	}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := idx.Add(ctx, nil, keys[i%len(keys)], entries[i%8]); err != nil {
			b.Fatal(err)
		}
	}
}

// held is how many leading blocks pod p of n holds.
func held(p, n int) int { return blocks - p*(blocks/n) }

func oursScore(n int) func(b *testing.B) {
	return func(b *testing.B) {
		idx := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
		in := kvindex.NewInterner()
		m := in.Model(model)
		var keys []blockkeys.Key
		for _, k := range promptKeys(1)[0] {
			keys = append(keys, blockkeys.Key(k))
		}
		ctx := context.Background()
		for p := 0; p < n; p++ {
			if err := idx.Add(ctx, m, in.Pod(fmt.Sprintf("pod-%d", p), 0), event.TierGPU, keys[:held(p, n)]); err != nil {
				b.Fatal(err)
			}
		}
		sc := kvindex.NewScorer(idx, idx, kvindex.DefaultTierWeights())
		var res kvindex.ScoreResult
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := sc.Score(ctx, m, keys, nil, &res); err != nil || len(res.Pods) != n {
				b.Fatalf("score: %v, %d pods", err, len(res.Pods))
			}
		}
	}
}

// theirIndex is the peer's in-memory index with room for every pod of a key
// (its default keeps 10 pods per key, which would drop most of the 64).
func theirIndex(b *testing.B) *kvblock.InMemoryIndex {
	cfg := kvblock.DefaultInMemoryIndexConfig()
	cfg.PodCacheSize = 128
	idx, err := kvblock.NewInMemoryIndex(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return idx
}

func theirsScore(n int) func(b *testing.B) {
	return func(b *testing.B) {
		idx := theirIndex(b)
		var keys []kvblock.BlockHash
		for _, k := range promptKeys(1)[0] {
			keys = append(keys, kvblock.BlockHash(k))
		}
		ctx := context.Background()
		for p := 0; p < n; p++ {
			e := []kvblock.PodEntry{{PodIdentifier: fmt.Sprintf("pod-%d", p), DeviceTier: "gpu"}}
			if err := idx.Add(ctx, nil, keys[:held(p, n)], e); err != nil {
				b.Fatal(err)
			}
		}
		sc, err := kvcache.NewKVBlockScorer(kvcache.DefaultKVBlockScorerConfig())
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			hits, err := idx.Lookup(ctx, keys, nil)
			if err != nil {
				b.Fatal(err)
			}
			scores, err := sc.Score(ctx, keys, hits)
			if err != nil || len(scores) != n {
				b.Fatalf("score: %v, %d pods", err, len(scores))
			}
		}
	}
}

func oursHash(b *testing.B) {
	h, p := ourHasher(b), prompt(3)
	dst := make([]blockkeys.Key, 0, blocks)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = h.Keys(dst[:0], p, blockkeys.RequestExtras{})
	}
}

func theirsHash(b *testing.B) {
	tp, p := theirProcessor(b), prompt(3)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, p, model, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// vllmPayload is one engine step in vLLM's wire form (array form, as vLLM
// sends it): 32 stored blocks with token ids and a parent, 16 removed.
func vllmPayload(b *testing.B) []byte {
	h, toks := ourHasher(b), prompt(4)[:48*blockSize]
	keys := h.Keys(nil, toks, blockkeys.RequestExtras{})
	st := event.Event{Kind: event.BlockStored, BlockSize: blockSize, Medium: event.TierGPU,
		TokenIDs: toks[blockSize : 33*blockSize], ParentHash: uint64(keys[0]), HasParent: true}
	for _, k := range keys[1:33] {
		st.BlockHashes = append(st.BlockHashes, uint64(k))
	}
	rm := event.Event{Kind: event.BlockRemoved, Medium: event.TierGPU}
	for _, k := range keys[32:48] {
		rm.BlockHashes = append(rm.BlockHashes, uint64(k))
	}
	p, err := enginepub.EncodeVLLMBatch(&event.Batch{Timestamp: 1.7e9, Events: []event.Event{st, rm}}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func oursDecode(b *testing.B) {
	p := vllmPayload(b)
	var batch event.Batch
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := kvevents.Decode(p, blockkeys.EngineVLLM, &batch); err != nil || len(batch.Events) != 2 {
			b.Fatalf("decode: %v", err)
		}
	}
}

func theirsDecode(b *testing.B) {
	msg := &llmdevents.RawMessage{Topic: "kv@pod-0@" + model, Payload: vllmPayload(b)}
	a := engineadapter.NewVLLMAdapter()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, batch, err := a.ParseMessage(msg); err != nil || len(batch.Events) != 2 {
			b.Fatalf("decode: %v", err)
		}
	}
}
