package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/gie-scorer/gie"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization"
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
// daemon on a unix socket, and for the least loaded pod when it is gone.
func TestScorerThroughDaemon(t *testing.T) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: keys, Tokenizer: fakeTokenizer{}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Indexer: idx, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// A sidecar daemon on a unix socket, dialed as unix:///path.
	dir, err := os.MkdirTemp("", "gie") // short: socket paths are limited to ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	addr := api.UnixPrefix + filepath.Join(dir, "k.sock")
	ln, err := api.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer()
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	prompt := "the same long system prompt!"
	tokens, _ := fakeTokenizer{}.TokenizePrompt(context.Background(), "m", prompt)
	hs, err := blockkeys.NewHasherSet(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, k := range hs.For("m").Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	idx.Sink().Apply(context.Background(), &event.Batch{Pod: "warm", Model: "m",
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:len(hashes)*4], BlockSize: 4}}})

	c, err := client.New(client.Config{Addr: addr, Timeout: time.Second})
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

// The command works as the README runs it after `make run`: its default
// model is the one make run serves with the committed tokenizer, and a
// model the daemon has no tokenizer for is an error that says so, not a
// silent row of zeros.
func TestRunAgainstMakeRunDaemon(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	runArgs := regexp.MustCompile(`(?m)^RUN_DEMO_ARGS \?=.*--tokenizer ([^ =]+)=(\S+)`).FindSubmatch(makefile)
	if runArgs == nil || string(runArgs[1]) != defaultModel {
		t.Fatalf("make run does not serve %s with a tokenizer (RUN_DEMO_ARGS: %q)", defaultModel, runArgs)
	}
	dir := filepath.Join("../..", string(runArgs[2]))

	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
	reg := tokenization.NewRegistry(tokenization.RegistryConfig{Models: map[string]string{defaultModel: dir}})
	store := prefixstore.New(prefixstore.Config{}, reg, nil)
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: keys, Tokenizer: store})
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

	prompt := "You are a helpful assistant. Answer briefly and cite your sources. The user asks about the weather in Lisbon."
	tokens, err := store.TokenizePrompt(context.Background(), defaultModel, prompt)
	if err != nil {
		t.Fatal(err)
	}
	h, err := blockkeys.NewHasher(keys)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	if len(hashes) == 0 {
		t.Fatalf("the prompt is %d tokens, less than a block", len(tokens))
	}
	idx.Sink().Apply(context.Background(), &event.Batch{Pod: "warm", Model: defaultModel,
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:len(hashes)*16], BlockSize: 16}}})

	var stdout, stderr bytes.Buffer
	// The warm pod is the busier one: only its cache makes it the pick.
	if rc := run([]string{"-addr", ln.Addr().String(), "-prompt", prompt, "cold=0/0/0", "warm=2/0/0.3"}, &stdout, &stderr); rc != 0 ||
		stdout.String() != "cold\t0\nwarm\t1\n" {
		t.Fatalf("default model: exit %d, stdout %q, stderr %s", rc, stdout.String(), stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	rc := run([]string{"-addr", ln.Addr().String(), "-model", "m", "-prompt", prompt, "cold", "warm"}, &stdout, &stderr)
	if rc != 1 || stdout.String() != "cold\t0\nwarm\t0\n" ||
		!strings.Contains(stderr.String(), `the daemon has no tokenizer for model "m": use -model Qwen/Qwen3-8B`) {
		t.Fatalf("model without a tokenizer: exit %d, stdout %q, stderr %s", rc, stdout.String(), stderr.String())
	}

	stderr.Reset()
	if rc := run([]string{"-addr", ln.Addr().String()}, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), "name at least one endpoint") {
		t.Fatalf("no endpoints: exit %d, stderr %s", rc, stderr.String())
	}
}

// The scorer with the index in process (-embedded): it subscribes to an
// engine itself and votes for the pod whose cache holds the prompt; a
// model it cannot tokenize is an error, as from the daemon.
func TestScorerInProcess(t *testing.T) {
	engine, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	x, stop, err := startEmbedded(context.Background(), embeddedConfig{engines: []string{engine.Addr() + ",pod=warm"},
		model: "m", hashSeed: "0", blockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, _, err := startEmbedded(context.Background(), embeddedConfig{engines: []string{"tcp://127.0.0.1:1,warm"}, blockSize: 4}); err == nil {
		t.Fatal("-engine without pod= accepted")
	}

	tokens := []uint32{11, 12, 13, 14, 15, 16, 17, 18, 19}
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	payload, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: []event.Event{{Kind: event.BlockStored,
		BlockHashes: hashes, TokenIDs: tokens[:8], BlockSize: 4}}}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := engine.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := engine.Publish("kv@warm@m", 0, payload); err != nil {
		t.Fatal(err)
	}

	s := NewScorer("kv", InProcess{X: x}, "", slog.New(slog.DiscardHandler))
	cold := &endpoint{md: gie.EndpointMetadata{NamespacedName: gie.NamespacedName{Name: "cold"}}}
	warm := &endpoint{md: gie.EndpointMetadata{NamespacedName: gie.NamespacedName{Name: "warm"}}, m: gie.Metrics{RunningRequestsSize: 1}}
	// Both publish events: a pick made before the blocks arrive must not
	// enter the routing history (kept for pods without events).
	on := true
	r := &client.Request{Model: "m", TokenIDs: tokens, Candidates: []client.Candidate{{Pod: "cold", Events: &on}, {Pod: "warm", Running: 1, Events: &on}}}
	// Events are applied asynchronously: wait for the engine's blocks.
	for {
		d, err := s.c.Pick(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if d.Pod == "warm" {
			if d.Fallback || d.Index != 1 || d.Candidates[1].MatchedBlocks != 2 || d.Policy != "sglang" {
				t.Fatalf("decision %+v", d)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the engine's blocks never arrived: last decision %+v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A prompt needs a tokenizer the embedded index was not given.
	scores, err := s.score(context.Background(), &gie.LLMRequest{TargetModel: "m", Prompt: "hello"}, []gie.Endpoint{cold, warm})
	if err == nil || !strings.Contains(err.Error(), "tokenizer") || scores[cold] != 0 || scores[warm] != 0 {
		t.Fatalf("prompt without a tokenizer: %v, %v", scores, err)
	}
}
