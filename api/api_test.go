package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	indexerv1 "github.com/kvindex/kvindex/proto/llmd/indexer/v1"
)

const (
	testModel = "test/model"
	testBlock = 4
)

// stack is a real in-memory indexer (applier -> memory index -> scorer),
// served over a real gRPC server and an httptest server.
type stack struct {
	t testing.TB
	// hashers computes the keys the test's events carry, with the same
	// config as the indexer's.
	hashers *blockkeys.HasherSet
	idx     *indexer.Indexer
	srv     *Server
	http    *httptest.Server
	grpc    kvindexv1.IndexerClient
	llmd    indexerv1.IndexerServiceClient
	health  healthpb.HealthClient
}

var testKeys = blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: testBlock}

func newStack(t testing.TB) *stack {
	t.Helper()
	return newStackWith(t, indexer.Config{Keys: testKeys})
}

// newStackWith serves an indexer built from cfg (its Keys must be testKeys);
// each opt may change the server's Config (a subscriber, the admin API).
func newStackWith(t testing.TB, cfg indexer.Config, opts ...func(*Config)) *stack {
	t.Helper()
	st := &stack{t: t}
	var err error
	st.hashers, err = blockkeys.NewHasherSet(testKeys, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	if st.idx, err = indexer.New(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	scfg := Config{Indexer: st.idx, Registry: reg, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&scfg)
	}
	st.srv, err = New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	st.http = httptest.NewServer(st.srv.Handler())
	t.Cleanup(st.http.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := st.srv.NewGRPCServer()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st.grpc = kvindexv1.NewIndexerClient(conn)
	st.llmd = indexerv1.NewIndexerServiceClient(conn)
	st.health = healthpb.NewHealthClient(conn)
	return st
}

func seqTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

// store applies a BlockStored of the first nBlocks blocks of tokens.
func (st *stack) store(pod string, rank int, medium event.Tier, tokens []uint32, nBlocks int, extras blockkeys.RequestExtras) {
	keys := st.hashers.For(testModel).Keys(nil, tokens, extras)
	ev := event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: tokens[:nBlocks*testBlock],
		Medium: medium, LoraName: extras.LoraName}
	for _, k := range keys[:nBlocks] {
		ev.BlockHashes = append(ev.BlockHashes, uint64(k))
	}
	st.idx.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: testModel, DPRank: rank, Events: []event.Event{ev}})
}

type httpScore struct {
	TotalBlocks int `json:"total_blocks"`
	Pods        []struct {
		Pod           string           `json:"pod"`
		MatchedBlocks int              `json:"matched_blocks"`
		MatchedTokens int64            `json:"matched_tokens"`
		Score         float64          `json:"score"`
		Tiers         map[string]int32 `json:"tiers"`
		DPRanks       []struct {
			DPRank        int              `json:"dp_rank"`
			MatchedBlocks int              `json:"matched_blocks"`
			Score         float64          `json:"score"`
			Tiers         map[string]int32 `json:"tiers"`
		} `json:"dp_ranks"`
	} `json:"pods"`
}

func (st *stack) post(path, body string) (int, []byte) {
	st.t.Helper()
	resp, err := http.Post(st.http.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (st *stack) scoreHTTP(body string) httpScore {
	st.t.Helper()
	code, b := st.post("/v1/score", body)
	if code != http.StatusOK {
		st.t.Fatalf("POST /v1/score %s: %d %s", body, code, b)
	}
	var out httpScore
	if err := json.Unmarshal(b, &out); err != nil {
		st.t.Fatalf("decode %s: %v", b, err)
	}
	return out
}

// summary renders a score answer as "pod:blocks/tokens[rank:blocks,...]" in
// answer order, so both transports compare as one string.
func summaryHTTP(s httpScore) string {
	var b strings.Builder
	fmt.Fprintf(&b, "total=%d", s.TotalBlocks)
	for _, p := range s.Pods {
		fmt.Fprintf(&b, " %s:%d/%d/%.2f[", p.Pod, p.MatchedBlocks, p.MatchedTokens, p.Score)
		for _, r := range p.DPRanks {
			fmt.Fprintf(&b, "%d:%d,", r.DPRank, r.MatchedBlocks)
		}
		b.WriteString("]")
	}
	return b.String()
}

func summaryGRPC(s *kvindexv1.ScoreResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "total=%d", s.TotalBlocks)
	for _, p := range s.Pods {
		fmt.Fprintf(&b, " %s:%d/%d/%.2f[", p.Pod, p.MatchedBlocks, p.MatchedTokens, p.Score)
		for _, r := range p.DpRanks {
			fmt.Fprintf(&b, "%d:%d,", r.DpRank, r.MatchedBlocks)
		}
		b.WriteString("]")
	}
	return b.String()
}

func TestScoreBothTransports(t *testing.T) {
	st := newStack(t)
	prompt := seqTokens(1000, 10*testBlock+2) // 10 full blocks + a partial one
	st.store("pod-a", 0, event.TierGPU, prompt, 6, blockkeys.RequestExtras{})
	st.store("pod-b", 0, event.TierCPU, prompt, 8, blockkeys.RequestExtras{})
	st.store("pod-c", 0, event.TierGPU, prompt, 2, blockkeys.RequestExtras{})
	st.store("pod-c", 1, event.TierGPU, prompt, 7, blockkeys.RequestExtras{})
	st.store("pod-d", 0, event.TierGPU, seqTokens(5000, 8*testBlock), 8, blockkeys.RequestExtras{}) // other prefix

	ids, _ := json.Marshal(prompt)
	h := st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `}`)
	// pod-c rank 1: 7 GPU blocks = 7.0; pod-b: 8 CPU blocks = 6.4; pod-a: 6.0.
	want := "total=10 pod-c:7/28/7.00[1:7,0:2,] pod-b:8/32/6.40[0:8,] pod-a:6/24/6.00[0:6,]"
	if got := summaryHTTP(h); got != want {
		t.Fatalf("HTTP score:\n got %s\nwant %s", got, want)
	}
	if h.Pods[1].Tiers["cpu"] != 8 || h.Pods[1].Tiers["gpu"] != 0 {
		t.Errorf("pod-b tiers = %v, want 8 cpu", h.Pods[1].Tiers)
	}
	g, err := st.grpc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := summaryGRPC(g); got != want {
		t.Fatalf("gRPC score:\n got %s\nwant %s", got, want)
	}
	if g.Pods[1].Tiers.GetCpu() != 8 {
		t.Errorf("gRPC pod-b tiers = %v", g.Pods[1].Tiers)
	}

	// Block hashes are the same keys: same answer.
	keys := st.hashers.For(testModel).Keys(nil, prompt, blockkeys.RequestExtras{})
	hb, _ := json.Marshal(keys)
	if got := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","block_hashes":` + string(hb) + `}`)); got != want {
		t.Fatalf("block_hashes score:\n got %s\nwant %s", got, want)
	}

	// Pod filter: every DP rank of the named pods, nothing else.
	fil := st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `,"pods":["pod-a","pod-c","nope"]}`)
	if got, want := summaryHTTP(fil), "total=10 pod-c:7/28/7.00[1:7,0:2,] pod-a:6/24/6.00[0:6,]"; got != want {
		t.Fatalf("filtered score:\n got %s\nwant %s", got, want)
	}
	// A filter naming only unknown pods, an unknown model: empty, not an error.
	if got := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `,"pods":["nope"]}`)); got != "total=10" {
		t.Fatalf("unknown pod filter: %s", got)
	}
	if got := summaryHTTP(st.scoreHTTP(`{"model":"other","token_ids":` + string(ids) + `}`)); got != "total=10" {
		t.Fatalf("unknown model: %s", got)
	}
}

func TestScoreExtrasChangeKeys(t *testing.T) {
	st := newStack(t)
	prompt := seqTokens(1, 4*testBlock)
	st.store("pod-lora", 0, event.TierGPU, prompt, 4, blockkeys.RequestExtras{LoraName: "sql-adapter"})
	ids, _ := json.Marshal(prompt)
	if got := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `,"lora_name":"sql-adapter"}`)); got != "total=4 pod-lora:4/16/4.00[0:4,]" {
		t.Fatalf("with lora: %s", got)
	}
	if got := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `}`)); got != "total=4" {
		t.Fatalf("without lora the keys differ, want no match: %s", got)
	}
}

func TestScoreInvalid(t *testing.T) {
	st := newStack(t)
	st.store("pod-a", 0, event.TierGPU, seqTokens(1, 8), 2, blockkeys.RequestExtras{})
	m := `"model":"` + testModel + `"`
	cases := []struct{ body, reason string }{
		{`{` + m + `}`, "one of token_ids"},
		{`{` + m + `,"token_ids":[]}`, "one of token_ids"},
		{`{` + m + `,"token_ids":[1,2],"block_hashes":[3]}`, "exactly one"},
		{`{` + m + `,"token_ids":[1],"prompt":"x"}`, "exactly one"},
		{`{` + m + `,"token_ids":[1],"temperature":1}`, "unknown field"},
		{`{` + m + `,"token_ids":[-1]}`, "out of range"},
		{`{` + m + `,"token_ids":[4294967296]}`, "out of range"},
		{`{` + m + `,"token_ids":[1.5]}`, "invalid JSON"},
		{`{` + m + `,"block_hashes":["x"]}`, "not a 64-bit integer"},
		{`{` + m + `,"token_ids":[1,]}`, "invalid JSON"},
		{`{` + m + `,"token_ids":[99999999999999999999999]}`, "out of range"},
		{`{` + m + `,"token_ids":"1"}`, "expected an array"},
		{`{` + m + `,"model":"a\u0000b","token_ids":[1]`, "invalid JSON"},
		{`{` + m + `,"block_hashes":[1e30]}`, "not a 64-bit integer"},
		{`{` + m + `,"block_hashes":[1],"lora_name":"a"}`, "lora_name"},
		{`{"token_ids":[1,2,3,4]}`, "model is required"},
		{`{"prompt":"hello"}`, "model is required"},
		{`{` + m + `,"prompt":""}`, "prompt is empty"},
		{`{` + m + `,"token_ids":[1],"pods":[""]}`, "empty name"},
		{`not json`, "invalid JSON"},
		{`{` + m + `,"token_ids":[1]} {}`, "trailing data"},
	}
	for _, c := range cases {
		code, b := st.post("/v1/score", c.body)
		if code != http.StatusBadRequest || !strings.Contains(string(b), c.reason) {
			t.Errorf("%s: got %d %s, want 400 containing %q", c.body, code, b, c.reason)
		}
	}
	// Valid odd forms: hashes as strings and signed ints, escaped strings.
	if code, b := st.post("/v1/score", ` { "model" : "test\/mod\u0065l", "block_hashes" : [ "18446744073709551615" , -1 ], "pods": null } `); code != http.StatusOK || !strings.Contains(string(b), `"total_blocks":2`) {
		t.Errorf("valid odd body: %d %s", code, b)
	}
	// gRPC: InvalidArgument with the reason.
	for _, req := range []*kvindexv1.ScoreRequest{
		{Model: testModel},
		{Model: testModel, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{}}},
		{Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1}}}},
		{Input: &kvindexv1.ScoreRequest_Prompt{Prompt: "hi"}},
	} {
		_, err := st.grpc.Score(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
			t.Errorf("%v: got %v, want InvalidArgument with a reason", req, err)
		}
	}
	// Wrong method.
	resp, err := http.Get(st.http.URL + "/v1/score")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/score: %d", resp.StatusCode)
	}
}

func TestPromptWithoutTokenizerIsAnError(t *testing.T) {
	st := newStack(t)
	code, b := st.post("/v1/score", `{"model":"`+testModel+`","prompt":"hello"}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "prompt scoring is not configured") {
		t.Fatalf("got %d %s", code, b)
	}
	_, err := st.llmd.GetPodScores(context.Background(), &indexerv1.GetPodScoresRequest{Prompt: "hello", ModelName: testModel})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("GetPodScores: %v", err)
	}
}

func TestPodsMetricsHealth(t *testing.T) {
	st := newStack(t)
	st.store("pod-a", 0, event.TierGPU, seqTokens(1, 12), 3, blockkeys.RequestExtras{})
	st.store("pod-a", 1, event.TierGPU, seqTokens(1, 12), 1, blockkeys.RequestExtras{})
	st.scoreHTTP(`{"model":"` + testModel + `","token_ids":[1,2,3,4,5,6,7,8]}`)

	resp, err := http.Get(st.http.URL + "/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	var pods struct{ Pods []PodInfo }
	err = json.NewDecoder(resp.Body).Decode(&pods)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Pods) != 2 || pods.Pods[0].Pod != "pod-a" || pods.Pods[0].DPRank != 0 || pods.Pods[0].Blocks != 3 ||
		pods.Pods[1].DPRank != 1 || pods.Pods[1].Blocks != 1 || pods.Pods[0].Model != testModel {
		t.Fatalf("pods = %+v", pods.Pods)
	}
	if pods.Pods[0].ParityMatches != 3 || pods.Pods[0].ParityMismatches != 0 {
		t.Errorf("parity = %d/%d, want 3 matches (hashes came from the same hasher)", pods.Pods[0].ParityMatches, pods.Pods[0].ParityMismatches)
	}
	lp, err := st.grpc.ListPods(context.Background(), &kvindexv1.ListPodsRequest{})
	if err != nil || len(lp.Pods) != 2 || lp.Pods[0].Blocks != 3 {
		t.Fatalf("ListPods: %v %v", lp, err)
	}

	resp, err = http.Get(st.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`kvindexd_score_requests_total{code="OK",input="token_ids"} 1`,
		`kvindexd_index_entries 4`,
		`kvindexd_pod_blocks_stored_total{dp_rank="1",model="test/model",pod="pod-a"} 1`,
		`kvindexd_score_lookup_seconds_count 1`,
	} {
		if !bytes.Contains(m, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(st.http.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
	hc, err := st.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "kvindex.v1.Indexer"})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
	defer func() {
		// Shutdown (SIGTERM) drains: NOT_SERVING and /readyz 503 while
		// in-flight requests finish.
		st.srv.Shutdown()
		hc, err := st.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "kvindex.v1.Indexer"})
		if err != nil || hc.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health after Shutdown: %v %v", hc, err)
		}
		resp, err := http.Get(st.http.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "shutting down") {
			t.Errorf("/readyz after Shutdown: %d %s", resp.StatusCode, body)
		}
	}()
	// No subscriber: endpoint management is reported as not available.
	resp, err = http.Get(st.http.URL + "/v1/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("/v1/endpoints without subscriber: %d", resp.StatusCode)
	}
}

// fakeSubscriber records endpoint management calls and answers Streams
// with what a test put in streams.
type fakeSubscriber struct {
	eps     []kvevents.EndpointConfig
	streams []kvevents.StreamStats
}

func (f *fakeSubscriber) AddEndpoint(ep kvevents.EndpointConfig) error {
	for _, e := range f.eps {
		if e.Address == ep.Address && !(e.Share && ep.Share && e.Pod != ep.Pod) {
			return fmt.Errorf("endpoint %q already added", ep.Address)
		}
	}
	f.eps = append(f.eps, ep)
	return nil
}

func (f *fakeSubscriber) RemoveEndpointPod(address, pod string) error {
	for i, e := range f.eps {
		if e.Address == address && e.Pod == pod {
			f.eps = append(f.eps[:i], f.eps[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("%q pod %q: %w", address, pod, kvevents.ErrUnknownEndpoint)
}

func (f *fakeSubscriber) RemoveEndpoint(address string) error {
	for i, e := range f.eps {
		if e.Address == address {
			f.eps = append(f.eps[:i], f.eps[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("%q: %w", address, kvevents.ErrUnknownEndpoint)
}

func (f *fakeSubscriber) Endpoints() []kvevents.EndpointStatus {
	var out []kvevents.EndpointStatus
	for _, e := range f.eps {
		out = append(out, kvevents.EndpointStatus{Address: e.Address, Pod: e.Pod, Model: e.Model, Engine: e.Engine,
			ReplayAddress: e.ReplayAddress, SnapshotAddress: e.SnapshotAddress})
	}
	return out
}

func (f *fakeSubscriber) Streams() []kvevents.StreamStats { return f.streams }
func (f *fakeSubscriber) ApplyStall() time.Duration       { return 0 }

// The /v1/endpoints surface: 201 with a JSON echo, the listing, 400 with a
// reason for an invalid body, 404 for an unknown address.
func TestEndpointsHTTP(t *testing.T) {
	sub := &fakeSubscriber{}
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: testKeys})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Indexer: idx, Subscriber: sub, Logger: slog.New(slog.DiscardHandler), AdminAPI: true})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	do := func(method, path, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := do("POST", "/v1/endpoints", `{"address":"tcp://10.0.0.7:5557","pod":"p7","engine":"sglang"}`)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, `"pod": "p7"`) {
		t.Fatalf("POST: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if len(sub.eps) != 1 || sub.eps[0].Engine != blockkeys.EngineSGLang {
		t.Fatalf("subscriber got %+v", sub.eps)
	}
	// The answer is the endpoint as the daemon holds it: the engine is
	// named also when the request left it to the default.
	if resp, body := do("POST", "/v1/endpoints", `{"address":" tcp://10.0.0.9:5557 ","pod":"p9"}`); resp.StatusCode != http.StatusCreated ||
		!strings.Contains(body, `"engine": "vllm"`) || !strings.Contains(body, `"address": "tcp://10.0.0.9:5557"`) {
		t.Fatalf("POST without an engine: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("DELETE", "/v1/endpoints?address=tcp://10.0.0.9:5557", ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct{ body, reason string }{
		{`{"pod":"p"}`, "address is required"},
		{`{"address":"tcp://a:1","engine":"tgi"}`, "want vllm, sglang or trtllm"},
		{`{"address":"tcp://a:1","colour":"blue"}`, "unknown field"},
		{`{"address":"tcp://10.0.0.7:5557"}`, "already added"},
	} {
		if resp, body := do("POST", "/v1/endpoints", c.body); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, c.reason) {
			t.Errorf("POST %s: %d %s, want 400 with %q", c.body, resp.StatusCode, body, c.reason)
		}
	}
	if resp, body := do("GET", "/v1/endpoints", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"engine": "sglang"`) {
		t.Fatalf("GET: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("DELETE", "/v1/endpoints?address=tcp://nowhere:1", ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("DELETE unknown: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("DELETE", "/v1/endpoints", `{"address":"tcp://10.0.0.7:5557"}`); resp.StatusCode != http.StatusNoContent || len(sub.eps) != 0 {
		t.Fatalf("DELETE by body: %d %s (left %+v)", resp.StatusCode, body, sub.eps)
	}
}

// downIndex is an in-memory index whose health check fails, as a Redis
// backend does while Redis is unreachable.
type downIndex struct{ *kvindex.MemoryIndex }

func (downIndex) Healthy(context.Context) error { return errors.New("connection refused") }

// An index that is down answers 503 / Unavailable with the reason, never an
// empty score that would look like a cache miss, and is not ready.
func TestUnavailableIndexMapsTo503(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys,
		Backend: func(context.Context, *kvindex.Interner) (indexer.Backend, error) {
			d := downIndex{kvindex.NewMemoryIndex(kvindex.MemoryConfig{})}
			return indexer.Backend{Index: d, Health: d}, nil
		}})
	code, b := st.post("/v1/score", `{"model":"`+testModel+`","token_ids":[1,2,3,4]}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(b), "connection refused") {
		t.Fatalf("HTTP: %d %s, want 503 with the reason", code, b)
	}
	_, err := st.grpc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2, 3, 4}}}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC: %v, want Unavailable", err)
	}
	if ok, why := st.srv.Ready(); ok || !strings.Contains(why, "not checked") {
		t.Fatalf("Ready before a health check = %v %q", ok, why)
	}
	if err := st.srv.CheckHealth(context.Background()); err == nil {
		t.Fatal("CheckHealth of a down index succeeded")
	}
	if ok, why := st.srv.Ready(); ok || !strings.Contains(why, "connection refused") {
		t.Fatalf("Ready after a failed check = %v %q", ok, why)
	}
}

// tier_runs counts each tier's own run from block 0 (a block on two tiers
// in both), per pod and per DP rank, the same on both transports; tiers
// still counts each block once at its best tier.
func TestScoreTierRunsBothTransports(t *testing.T) {
	st := newStack(t)
	prompt := seqTokens(1000, 8*testBlock)
	st.store("pod-x", 0, event.TierGPU, prompt, 4, blockkeys.RequestExtras{})
	st.store("pod-x", 0, event.TierCPU, prompt, 6, blockkeys.RequestExtras{})
	st.store("pod-x", 1, event.TierCPU, prompt, 3, blockkeys.RequestExtras{})
	ids, _ := json.Marshal(prompt)
	code, b := st.post("/v1/score", `{"model":"`+testModel+`","token_ids":`+string(ids)+`}`)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/score: %d %s", code, b)
	}
	type counts map[string]int32
	var h struct {
		Pods []struct {
			Tiers    counts `json:"tiers"`
			TierRuns counts `json:"tier_runs"`
			DPRanks  []struct {
				DPRank   int    `json:"dp_rank"`
				TierRuns counts `json:"tier_runs"`
			} `json:"dp_ranks"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if len(h.Pods) != 1 || len(h.Pods[0].DPRanks) != 2 {
		t.Fatalf("answer %s: want pod-x with 2 ranks", b)
	}
	p := h.Pods[0]
	if p.Tiers["gpu"] != 4 || p.Tiers["cpu"] != 2 || p.TierRuns["gpu"] != 4 || p.TierRuns["cpu"] != 6 || p.TierRuns["disk"] != 0 {
		t.Errorf("HTTP tiers %v tier_runs %v, want gpu 4 cpu 2 and gpu 4 cpu 6", p.Tiers, p.TierRuns)
	}
	if r := p.DPRanks[1]; r.DPRank != 1 || r.TierRuns["cpu"] != 3 || r.TierRuns["gpu"] != 0 {
		t.Errorf("HTTP rank %d tier_runs %v, want cpu 3", r.DPRank, r.TierRuns)
	}
	g, err := st.grpc.Score(context.Background(), &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Pods) != 1 || len(g.Pods[0].DpRanks) != 2 {
		t.Fatalf("gRPC answer %v: want pod-x with 2 ranks", g)
	}
	gp := g.Pods[0]
	if gp.TierRuns.GetGpu() != 4 || gp.TierRuns.GetCpu() != 6 || gp.Tiers.GetCpu() != 2 {
		t.Errorf("gRPC tiers %v tier_runs %v", gp.Tiers, gp.TierRuns)
	}
	if r := gp.DpRanks[1]; r.DpRank != 1 || r.TierRuns.GetCpu() != 3 || r.TierRuns.GetGpu() != 0 {
		t.Errorf("gRPC rank %d tier_runs %v, want cpu 3", r.DpRank, r.TierRuns)
	}
}
