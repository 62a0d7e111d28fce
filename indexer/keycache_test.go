package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// The token and prompt paths share the key cache, a repeated prefix is not
// hashed again, and answers equal those of an indexer without the cache.
func TestKeyCacheOnScorePaths(t *testing.T) {
	reg := prometheus.NewRegistry()
	x := newTestIndexer(t, Config{Registry: reg, Tokenizer: fakeTokenizer{}})
	plain := newTestIndexer(t, Config{KeyCacheSize: -1, Tokenizer: fakeTokenizer{}})
	if plain.keys != nil {
		t.Fatal("KeyCacheSize -1 must disable the key cache")
	}
	prompt := "abcdefghijklmnop" // four blocks of the fake tokenizer's bytes
	for _, ix := range []*Indexer{x, plain} {
		apply(ix, "pod-a", 0, storeEvent(seqTokens('a', 16), 3, event.TierGPU))
	}
	queries := []*Query{
		{Model: testModel, Kind: InputPrompt, Prompt: prompt},
		{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens('a', 16)},
		{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens('a', 12)},
		{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens('a', 16), LoraName: "adapter"},
	}
	var r Result
	for _, q := range queries {
		if got, want := mustScore(t, x, q, &r), mustScore(t, plain, q, &r); got != want {
			t.Fatalf("%+v: cached %s, uncached %s", q, got, want)
		}
	}
	// The prompt misses 4 blocks; the token queries hit 4 + 3; the LoRA
	// query bypasses the cache.
	for name, want := range map[string]float64{
		"kvindexd_key_cache_hits_total":      7,
		"kvindexd_key_cache_misses_total":    4,
		"kvindexd_key_cache_capacity_blocks": blockkeys.DefaultKeyCacheSize,
		"kvindexd_key_cache_evictions_total": 0,
	} {
		if got := gatherValue(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func gatherValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

// BenchmarkScoreTokensCold is BenchmarkScoreTokens with a prompt the key
// cache has never seen on every call (its first token changes, so every
// block key does): hashing all 512 blocks, plus filling the cache.
func BenchmarkScoreTokensCold(b *testing.B) {
	ix, prompt := benchIndexer(b)
	q := &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}
	var r Result
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		prompt[0] = uint32(1<<20 + i)
		if err := ix.Score(context.Background(), q, &r); err != nil {
			b.Fatal(err)
		}
	}
}
