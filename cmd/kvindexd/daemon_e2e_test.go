package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	indexerv1 "github.com/kvindex/kvindex/proto/llmd/indexer/v1"
	"github.com/kvindex/kvindex/tokenization"
)

// indexBackend gives the --index value for a test; the same end-to-end test
// runs on every backend and must give identical answers.
type indexBackend struct {
	name  string
	index func(t *testing.T) string
}

var backends = []indexBackend{
	{"memory", func(*testing.T) string { return "memory" }},
	// redistest starts a throw-away redis-server on a free loopback port.
	{"redis", func(t *testing.T) string { return redistest.Start(t).URL() }},
}

const (
	e2eModel  = "e2e/model"
	e2eSeed   = "0"
	e2eBlock  = 16
	sglModel  = "e2e/sglang-model"
	waitLimit = 20 * time.Second
)

// testLogWriter sends the daemon's log to t.Log (shown on failure).
type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

// e2eDaemon is a daemon running in-process on loopback ports.
type e2eDaemon struct {
	t    *testing.T
	d    *daemon
	bind string
	base string
	grpc kvindexv1.IndexerClient
}

// startInProcess runs the daemon in this process from DefaultConfig changed
// by mutate: these tests check the composition root (flags, config and the
// parts newDaemon wires) and reach into its parts. The binary as shipped is
// started through internal/testkit/harness (internal/promises,
// internal/docexamples, internal/e2e).
func startInProcess(t *testing.T, mutate func(*Config)) *e2eDaemon {
	t.Helper()
	return startInProcessCtx(t, context.Background(), mutate)
}

// startInProcessCtx runs a daemon until parent is done or the test ends.
func startInProcessCtx(t *testing.T, parent context.Context, mutate func(*Config)) *e2eDaemon {
	t.Helper()
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.ZMQBind = "127.0.0.1:0", "127.0.0.1:0", "tcp://127.0.0.1:0"
	cfg.HashAlgo, cfg.HashSeed, cfg.BlockSize = "sha256", e2eSeed, e2eBlock
	cfg.Workers = 2
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	lw := &testLogWriter{t: t}
	log := slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(parent)
	d, err := newDaemon(ctx, cfg, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon Run: %v", err)
		}
		lw.mu.Lock()
		lw.done = true
		lw.mu.Unlock()
	})
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &e2eDaemon{t: t, d: d, bind: d.idx.Subscriber().BindAddr(), base: "http://" + d.HTTPAddr(), grpc: kvindexv1.NewIndexerClient(conn)}
}

// query is one score request, sent over both transports.
type query struct {
	model     string
	tokens    []uint32
	hashes    []uint64
	pods      []string
	loraName  string
	cacheSalt string
}

func (q query) httpBody() string {
	m := map[string]any{"model": q.model}
	if q.tokens != nil {
		m["token_ids"] = q.tokens
	} else {
		m["block_hashes"] = q.hashes
	}
	if q.pods != nil {
		m["pods"] = q.pods
	}
	if q.loraName != "" {
		m["lora_name"] = q.loraName
	}
	if q.cacheSalt != "" {
		m["cache_salt"] = q.cacheSalt
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (q query) grpcReq() *kvindexv1.ScoreRequest {
	r := &kvindexv1.ScoreRequest{Model: q.model, Pods: q.pods, LoraName: q.loraName, CacheSalt: q.cacheSalt}
	if q.tokens != nil {
		r.Input = &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: q.tokens}}
	} else {
		r.Input = &kvindexv1.ScoreRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: q.hashes}}
	}
	return r
}

// scores renders both transports' answers as "pod=blocks[rank:blocks ...]"
// in answer order; an error is rendered too so the poll can report it.
func (e *e2eDaemon) scores(q query) (httpS, grpcS string) {
	resp, err := http.Post(e.base+"/v1/score", "application/json", strings.NewReader(q.httpBody()))
	if err != nil {
		httpS = "error: " + err.Error()
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			TotalBlocks int `json:"total_blocks"`
			Pods        []struct {
				Pod           string `json:"pod"`
				MatchedBlocks int    `json:"matched_blocks"`
				MatchedTokens int    `json:"matched_tokens"`
				DPRanks       []struct {
					DPRank        int `json:"dp_rank"`
					MatchedBlocks int `json:"matched_blocks"`
				} `json:"dp_ranks"`
			} `json:"pods"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
			httpS = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, body)
		} else {
			var rows []podRow
			for _, p := range out.Pods {
				r := podRow{pod: p.Pod, blocks: p.MatchedBlocks, tokens: int64(p.MatchedTokens)}
				for _, dr := range p.DPRanks {
					r.ranks = append(r.ranks, [2]int{dr.DPRank, dr.MatchedBlocks})
				}
				rows = append(rows, r)
			}
			httpS = renderPods(rows)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := e.grpc.Score(ctx, q.grpcReq())
	if err != nil {
		return httpS, "error: " + err.Error()
	}
	var rows []podRow
	for _, p := range g.Pods {
		r := podRow{pod: p.Pod, blocks: int(p.MatchedBlocks), tokens: p.MatchedTokens}
		for _, dr := range p.DpRanks {
			r.ranks = append(r.ranks, [2]int{int(dr.DpRank), int(dr.MatchedBlocks)})
		}
		rows = append(rows, r)
	}
	return httpS, renderPods(rows)
}

// podRow is one pod of a score answer, from either transport.
type podRow struct {
	pod    string
	blocks int
	tokens int64
	ranks  [][2]int // (dp rank, matched blocks), best first
}

// renderPods writes "pod=blocks" per pod, with "[rank:blocks ...]" for pods
// with data-parallel ranks and a marker when matched_tokens is inconsistent.
func renderPods(rows []podRow) string {
	var parts []string
	for _, p := range rows {
		s := fmt.Sprintf("%s=%d", p.pod, p.blocks)
		if p.tokens != int64(p.blocks)*e2eBlock {
			s += fmt.Sprintf("(tokens %d!)", p.tokens)
		}
		if len(p.ranks) != 1 || p.ranks[0][0] != 0 {
			s += "["
			for _, r := range p.ranks {
				s += fmt.Sprintf("%d:%d ", r[0], r[1])
			}
			s = strings.TrimSpace(s) + "]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// expect polls until both transports give want: events are applied
// asynchronously, so the test waits for the state rather than for a time.
func (e *e2eDaemon) expect(what string, q query, want string) {
	e.t.Helper()
	wait.Until(e.t, what, func() string {
		if h, g := e.scores(q); h != want || g != want {
			return fmt.Sprintf("\n HTTP %q\n gRPC %q\n want %q", h, g, want)
		}
		return ""
	})
}

func (e *e2eDaemon) do(method, path, body string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.base+path, bytes.NewReader([]byte(body)))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func hashesOf(keys []blockkeys.Key) []uint64 {
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = uint64(k)
	}
	return out
}

func stored(keys []blockkeys.Key, tokens []uint32, from, to int, medium string) pypub.Event {
	ev := pypub.Event{Type: "BlockStored", BlockHashes: hashesOf(keys[from:to]),
		TokenIDs: tokens[from*e2eBlock : to*e2eBlock], BlockSize: e2eBlock, Medium: medium}
	if from > 0 {
		p := uint64(keys[from-1])
		ev.ParentHash = &p
	}
	return ev
}

// TestEndToEnd drives the daemon with the real-libzmq publisher in both
// topologies and checks exact matches per pod over gRPC and HTTP, on every
// index backend. The hashes the publisher sends are computed with our hasher
// from token ids, so the daemon's live parity check must report all matches.
func TestEndToEnd(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			index := b.index(t)
			e := startInProcess(t, func(c *Config) { c.Index, c.AdminAPI = index, true })
			runEndToEnd(t, e)
		})
	}
}

func runEndToEnd(t *testing.T, e *e2eDaemon) {
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	if err != nil {
		t.Fatal(err)
	}
	// 8 full blocks and a partial one; ids above 2^16 and 2^31 exercise the
	// pickle integer forms on both sides.
	tokens := make([]uint32, 8*e2eBlock+5)
	for i := range tokens {
		tokens[i] = uint32(1000 + i*7)
	}
	tokens[3], tokens[40], tokens[100] = 70000, 3_000_000_000, 151643
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	if len(keys) != 8 {
		t.Fatalf("%d keys", len(keys))
	}
	q := query{model: e2eModel, tokens: tokens}

	// Central topology: the daemon binds, engines connect.
	pubA := pypub.StartPublisher(t, e.bind, false)
	pubB := pypub.StartPublisher(t, e.bind, false)
	pubC := pypub.StartPublisher(t, e.bind, false)
	for _, p := range []*pypub.Publisher{pubA, pubB, pubC} {
		p.WaitReady(waitLimit)
	}
	// pod-a: vLLM <= 0.23 array form, int hashes, 8 blocks on GPU.
	pubA.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 0, Form: "array", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 8, "GPU")}})
	// pod-b: map form, 32-byte digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0),
	// 4 blocks stored as two chained events (parent = block 1).
	pubB.Send(pypub.Batch{Topic: "kv@pod-b@" + e2eModel, Seq: 0, Form: "map", BytesHashes: true, DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, ""), stored(keys, tokens, 2, 4, "CPU")}})
	// pod-c: data parallel, rank 0 holds 2 blocks and rank 1 holds 6.
	pubC.Send(pypub.Batch{Topic: "kv@pod-c@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "GPU")}})
	pubC.Send(pypub.Batch{Topic: "kv@pod-c@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(1),
		Events: []pypub.Event{stored(keys, tokens, 0, 6, "GPU")}})
	e.expect("central topology", q, "pod-a=8 pod-c=6[1:6 0:2] pod-b=4")
	e.expect("block hashes input", query{model: e2eModel, hashes: hashesOf(keys)}, "pod-a=8 pod-c=6[1:6 0:2] pod-b=4")
	e.expect("pod filter", query{model: e2eModel, tokens: tokens, pods: []string{"pod-b", "pod-c"}}, "pod-c=6[1:6 0:2] pod-b=4")
	e.expect("a prefix of the prompt", query{model: e2eModel, tokens: tokens[:3*e2eBlock]}, "pod-a=3 pod-c=3[1:3 0:2] pod-b=3")

	// Per-pod topology: engines bind, the daemon connects (added at runtime).
	addrE := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pubE := pypub.StartPublisher(t, addrE, true)
	if code, body := e.do("POST", "/v1/endpoints", `{"address":"`+addrE+`","pod":"pod-e","model":"`+e2eModel+`"}`); code != http.StatusCreated {
		t.Fatalf("POST /v1/endpoints: %d %s", code, body)
	}
	pubE.WaitReady(waitLimit)
	// The endpoint's pod and model override the topic's.
	pubE.Send(pypub.Batch{Topic: "kv@ignored@ignored", Seq: 0, Form: "array", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 3, "")}})
	e.expect("connect topology", q, "pod-a=8 pod-c=6[1:6 0:2] pod-b=4 pod-e=3")

	// SGLang over the connect topology, added over gRPC. Its pages carry
	// SGLang's own hashes (computed by kvpublisher.py as SGLang does), which
	// the daemon computes from the request's tokens for SGLang pods.
	addrS := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pubS := pypub.StartPublisher(t, addrS, true)
	if _, err := e.grpc.AddEndpoint(context.Background(), &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{
		Address: addrS, Pod: "pod-s", Model: sglModel, Engine: "sglang"}}); err != nil {
		t.Fatal(err)
	}
	pubS.WaitReady(waitLimit)
	pubS.Send(pypub.Batch{Topic: "kv@pod-s@" + sglModel, Seq: 0, Form: "sglang", DPRank: pypub.Rank(0),
		Events: []pypub.Event{{Type: "BlockStored", HashTokens: true, TokenIDs: tokens[:3*e2eBlock], BlockSize: e2eBlock}}})
	e.expect("sglang", query{model: sglModel, tokens: tokens}, "pod-s=3")

	eps, err := e.grpc.ListEndpoints(context.Background(), &kvindexv1.ListEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, ep := range eps.Endpoints {
		listed = append(listed, fmt.Sprintf("%s/%s/%s/%v", ep.Pod, ep.Engine, map[bool]string{true: "bound", false: "conn"}[ep.Bound], ep.Connected))
	}
	if got := strings.Join(listed, ","); !strings.Contains(got, "pod-e/vllm/conn/true") || !strings.Contains(got, "pod-s/sglang/conn/true") || !strings.Contains(got, "/vllm/bound/true") {
		t.Errorf("endpoints: %s", got)
	}

	// Removing an endpoint forgets its pods.
	if code, body := e.do("DELETE", "/v1/endpoints?address="+addrE, ""); code != http.StatusNoContent {
		t.Fatalf("DELETE /v1/endpoints: %d %s", code, body)
	}
	e.expect("endpoint removed", q, "pod-a=8 pod-c=6[1:6 0:2] pod-b=4")
	if code, _ := e.do("DELETE", "/v1/endpoints?address="+addrE, ""); code != http.StatusNotFound {
		t.Errorf("second DELETE: %d, want 404", code)
	}

	// BlockRemoved: pod-a evicts its last 4 blocks.
	pubA.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 1, Form: "array", DPRank: pypub.Rank(0),
		Events: []pypub.Event{{Type: "BlockRemoved", BlockHashes: hashesOf(keys[4:8]), Medium: "GPU"}}})
	e.expect("block removed", q, "pod-c=6[1:6 0:2] pod-a=4 pod-b=4")
	// AllBlocksCleared: pod-b is gone.
	pubB.Send(pypub.Batch{Topic: "kv@pod-b@" + e2eModel, Seq: 1, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{{Type: "AllBlocksCleared"}}})
	e.expect("all blocks cleared", q, "pod-c=6[1:6 0:2] pod-a=4")
	// Restart: pod-a's sequence goes back to 0; what it held before is gone
	// and only what it stores after the restart counts.
	pubA.Send(pypub.Batch{Topic: "kv@pod-a@" + e2eModel, Seq: 0, Form: "array", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "GPU")}})
	e.expect("engine restart", q, "pod-c=6[1:6 0:2] pod-a=2")

	// Pod listing: restart counted, parity all matching for vLLM pods.
	lp, err := e.grpc.ListPods(context.Background(), &kvindexv1.ListPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range lp.Pods {
		key := fmt.Sprintf("%s/%d", p.Pod, p.DpRank)
		seen[key] = true
		if p.ParityMismatches != 0 {
			t.Errorf("%s: %d parity mismatches (hint %q)", key, p.ParityMismatches, p.ParityHint)
		}
		switch key {
		case "pod-a/0":
			if p.Restarts != 1 || p.Blocks != 2 || p.ParityMatches < 8 || p.Model != e2eModel {
				t.Errorf("pod-a: %+v", p)
			}
		case "pod-b/0":
			if p.Blocks != 0 || p.ParityMatches != 4 {
				t.Errorf("pod-b: %+v", p)
			}
		case "pod-c/1":
			if p.Blocks != 6 {
				t.Errorf("pod-c/1: %+v", p)
			}
		}
	}
	for _, k := range []string{"pod-a/0", "pod-b/0", "pod-c/0", "pod-c/1", "pod-s/0"} {
		if !seen[k] {
			t.Errorf("ListPods lacks %s: %v", k, lp.Pods)
		}
	}
	for _, p := range []*pypub.Publisher{pubA, pubB, pubC, pubE, pubS} {
		p.Close()
	}
}

// TestPromptScoring scores a /v1/completions prompt through the daemon's
// tokenizer registry and prefix store (Qwen3's committed tokenizer), over
// HTTP, kvindex.v1 gRPC and llm-d's indexer.v1.IndexerService. The engine
// side publishes blocks of the ids the reference-checked tokenizer produces.
func TestPromptScoring(t *testing.T) {
	const qwen = "Qwen/Qwen3-0.6B"
	dir := harness.RepoRoot(t) + "/tokenization/testdata/qwen3"
	e := startInProcess(t, func(c *Config) { c.Tokenizers = map[string]string{qwen: dir} })
	tok, err := tokenization.NewRegistry(tokenization.RegistryConfig{Models: map[string]string{qwen: dir}}).Get(qwen)
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("You are a careful assistant. Answer briefly and cite sources. ", 6) + "Question: what is a KV cache?"
	ids, err := tok.Encode(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	keys := h.Keys(nil, ids, blockkeys.RequestExtras{})
	if len(keys) < 4 {
		t.Fatalf("prompt has only %d blocks", len(keys))
	}
	pub := pypub.StartPublisher(t, e.bind, false)
	pub.WaitReady(waitLimit)
	pub.Send(pypub.Batch{Topic: "kv@pod-p@" + qwen, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, ids, 0, len(keys), "")}})
	pub.Send(pypub.Batch{Topic: "kv@pod-q@" + qwen, Seq: 0, Form: "map", DPRank: pypub.Rank(1),
		Events: []pypub.Event{stored(keys, ids, 0, 2, "")}})
	e.expect("token ids of the prompt", query{model: qwen, tokens: ids}, fmt.Sprintf("pod-p=%d pod-q=2[1:2]", len(keys)))

	body, _ := json.Marshal(map[string]any{"model": qwen, "prompt": prompt})
	code, resp := e.do("POST", "/v1/score", string(body))
	want := fmt.Sprintf(`"pod":"pod-p","matched_blocks":%d,`, len(keys))
	if code != http.StatusOK || !strings.Contains(resp, want) || !strings.Contains(resp, fmt.Sprintf(`"total_blocks":%d`, len(keys))) {
		t.Fatalf("prompt score: %d %s, want %s", code, resp, want)
	}
	g, err := e.grpc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: qwen, Input: &kvindexv1.ScoreRequest_Prompt{Prompt: prompt}})
	if err != nil || len(g.Pods) != 2 || int(g.Pods[0].MatchedBlocks) != len(keys) {
		t.Fatalf("gRPC prompt score: %v %v", g, err)
	}

	conn, err := grpc.NewClient(e.d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ll, err := indexerv1.NewIndexerServiceClient(conn).GetPodScores(context.Background(),
		&indexerv1.GetPodScoresRequest{Prompt: prompt, ModelName: qwen, PodIdentifiers: []string{"pod-q", "pod-p"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range ll.Scores {
		r := "-"
		if s.DataParallelRank != nil {
			r = fmt.Sprint(*s.DataParallelRank)
		}
		got = append(got, fmt.Sprintf("%s=%g@%s", s.Pod, s.Score, r))
	}
	if g := strings.Join(got, " "); g != fmt.Sprintf("pod-p=%d@- pod-q=2@1", len(keys)) {
		t.Fatalf("GetPodScores: %s", g)
	}

	// A model without a tokenizer is an error naming the model, never an empty score.
	code, resp = e.do("POST", "/v1/score", `{"model":"no/such-model","prompt":"hi"}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(resp, "no/such-model") {
		t.Fatalf("unknown model prompt: %d %s", code, resp)
	}
	pub.Close()
}

// TestPerModelKeyConfig: a model configured with its own hash algorithm
// (models: in the config file) is keyed with it. The engine hashes below are
// the spec's test vectors, produced by cbor2 + SHA-256 (sha256_cbor,
// PYTHONHASHSEED="0", block size 16, tokens 1..32), not by our code: the
// daemon must score them from token ids and count both as parity matches.
func TestPerModelKeyConfig(t *testing.T) {
	const cborModel = "cbor/model"
	e := startInProcess(t, func(c *Config) {
		c.Models = map[string]ModelConfig{cborModel: {HashAlgo: "sha256_cbor"}}
	})
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	pub := pypub.StartPublisher(t, e.bind, false)
	pub.WaitReady(waitLimit)
	pub.Send(pypub.Batch{Topic: "kv@pod-cbor@" + cborModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{{Type: "BlockStored", BlockHashes: []uint64{3236607068019569386, 2758186210834249151},
			TokenIDs: tokens, BlockSize: 16}}})
	e.expect("sha256_cbor model by token ids", query{model: cborModel, tokens: tokens}, "pod-cbor=2")
	// The override is the model's alone: the default model keeps sha256.
	// (Scoring e2eModel could not show it: the index is keyed by model, so
	// pod-cbor's blocks never match another model whatever its keys.)
	if got := e.d.idx.KeyConfig(e2eModel); got.Algo != blockkeys.AlgoSHA256 {
		t.Errorf("default model keyed with %+v, want sha256", got)
	}
	lp, err := e.grpc.ListPods(context.Background(), &kvindexv1.ListPodsRequest{})
	if err != nil || len(lp.Pods) != 1 || lp.Pods[0].ParityMatches != 2 || lp.Pods[0].ParityMismatches != 0 {
		t.Fatalf("parity: %v %v", lp, err)
	}
	pub.Close()
}
