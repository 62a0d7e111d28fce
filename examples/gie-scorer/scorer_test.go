package main

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/gie-scorer/gie"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvindex"
)

// fakeTokenizer turns each byte of a prompt into a token id, enough for
// the daemon's prompt path in a test.
type fakeTokenizer struct{}

// TokenizeRendered: the fake has no special tokens to leave out.
func (f fakeTokenizer) TokenizeRendered(ctx context.Context, model, prompt string) ([]uint32, error) {
	return f.TokenizePrompt(ctx, model, prompt)
}

func (fakeTokenizer) TokenizePrompt(_ context.Context, _, prompt string) ([]uint32, error) {
	out := make([]uint32, len(prompt))
	for i := range prompt {
		out[i] = uint32(prompt[i])
	}
	return out, nil
}

// The scorer votes for the pod whose cache holds the prompt, through a real
// daemon on loopback, and for the least loaded pod when it is gone.
func TestScorerThroughDaemon(t *testing.T) {
	keys := kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, Seed: "0", BlockSize: 4}
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: keys, Tokenizer: fakeTokenizer{}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Indexer: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	prompt := "the same long system prompt!"
	tokens, _ := fakeTokenizer{}.TokenizePrompt(context.Background(), "m", prompt)
	hs, err := kvindex.NewHasherSet(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, k := range hs.For("m").Keys(nil, tokens, kvindex.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	idx.Sink().Apply(context.Background(), &kvindex.Batch{Pod: "warm", Model: "m",
		Events: []kvindex.Event{{Kind: kvindex.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:len(hashes)*4], BlockSize: 4}}})

	c, err := client.New(client.Config{Addr: ln.Addr().String(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := NewScorer("kv", c, "", slog.New(slog.DiscardHandler))
	cold := &endpoint{md: gie.EndpointMetadata{NamespacedName: gie.NamespacedName{Name: "cold"}}}
	warm := &endpoint{md: gie.EndpointMetadata{NamespacedName: gie.NamespacedName{Name: "warm"}}, m: gie.Metrics{RunningRequestsSize: 1}}
	got := s.Score(context.Background(), nil, &gie.LLMRequest{TargetModel: "m", Prompt: prompt}, []gie.Endpoint{cold, warm})
	if got[warm] != 1 || got[cold] != 0 {
		t.Fatalf("scores %v", got)
	}

	gs.Stop()
	got = s.Score(context.Background(), nil, &gie.LLMRequest{TargetModel: "m", Prompt: prompt}, []gie.Endpoint{cold, warm})
	if got[cold] != 1 || got[warm] != 0 {
		t.Fatalf("fallback scores %v, want the least loaded (cold)", got)
	}
	if s.TypedName().Type != ScorerType || s.Category() != gie.Affinity {
		t.Fatal("plugin identity")
	}
}

func TestParseEndpoint(t *testing.T) {
	e, err := parseEndpoint("a=3/1/0.5")
	if err != nil || e.md.NamespacedName.Name != "a" || e.m.RunningRequestsSize != 3 || e.m.WaitingQueueSize != 1 || e.m.KVCacheUsagePercent != 0.5 {
		t.Fatalf("%+v %v", e, err)
	}
	if _, err := parseEndpoint("a=x"); err == nil {
		t.Fatal("bad load accepted")
	}
}
