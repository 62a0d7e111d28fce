package promises

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// otlpReceiver is an OpenTelemetry collector's trace service on a loopback
// gRPC server: the daemon's OTLP exporter talks to it exactly as to a real
// collector (the protobuf service of go.opentelemetry.io/proto/otlp).
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	addr string
	mu   sync.Mutex
	raw  [][]byte // every export request as received, marshalled again
	// spans by hex span id, with their resource's service.name
	spans []*tracepb.Span
	svc   map[string]string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{addr: ln.Addr().String(), svc: map[string]string{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return r
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.raw = append(r.raw, b)
	for _, rs := range req.GetResourceSpans() {
		name := attrString(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, s)
				r.svc[hex.EncodeToString(s.GetSpanId())] = name
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// trace returns the spans received so far of the trace with hex id.
func (r *otlpReceiver) trace(id string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if hex.EncodeToString(s.GetTraceId()) == id {
			out = append(out, s)
		}
	}
	return out
}

func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func attr(s *tracepb.Span, key string) (*commonpb.AnyValue, bool) {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue(), true
		}
	}
	return nil, false
}

// A traced request: its W3C trace and parent span ids.
type traced struct {
	name          string
	trace, parent string
}

func newTraced(name string, n int) traced {
	return traced{name: name, trace: fmt.Sprintf("%032x", 0x5eed0000+n), parent: fmt.Sprintf("%016x", 0xabc000+n)}
}

func (tr traced) header() string { return "00-" + tr.trace + "-" + tr.parent + "-01" }

// The secret the requests carry: it must never leave in a span.
const secretText = "quokka-zebra-7731 confidential"

// Issue 36: with the standard OTEL_* variables pointing at an OTLP
// collector, a request's trace arrives there with the caller's span as the
// parent of the daemon's request span, one child span per stage with its
// attributes, over HTTP and gRPC, for Score and Pick; a batch of engine
// events has its own span; and no span carries prompt text or token ids.
func TestPromiseTracesReachOTLPCollector(t *testing.T) {
	t.Parallel()
	harness.Heavy(t) // loads the qwen3 tokenizer
	rcv := startOTLPReceiver(t)
	d := harness.StartConfig(t, harness.Config{Flags: []string{tokenizerFlag(t)}, Env: []string{
		"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + rcv.addr, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_SERVICE_NAME=kvindexd-under-test",
	}})
	if !strings.Contains(d.Logs.String(), "tracing on") {
		t.Fatalf("no 'tracing on' log line:\n%s", d.Logs.String())
	}

	// pod-a holds the first 4 blocks of toks: the picks have a match.
	toks := prompt(77, 4)
	p := d.Publisher()
	publish(t, p, "pod-a", model, 1, stored(engineHashes(t, toks), toks))
	wait.For(t, "pod-a indexed", func() bool { return d.ScoreTokens(model, toks)["pod-a"] == 4 })

	// A chat long enough for the prefix store's chunks, so the second
	// identical request reuses the first one's tokens.
	chat := []map[string]string{{"role": "user", "content": strings.Repeat(secretText+" ", 120)}}
	candidates := []map[string]any{{"pod": "pod-a", "events": true}, {"pod": "pod-b", "events": true}}
	httpScore1, httpScore2 := newTraced("http score", 1), newTraced("http score again", 2)
	httpPick := newTraced("http pick", 3)
	grpcScore, grpcPick := newTraced("grpc score", 4), newTraced("grpc pick", 5)

	post := func(tr traced, path string, body map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", "http://"+d.HTTP+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", tr.header())
		req.Header.Set("tracestate", "router=kv")
		resp, err := (&http.Client{Timeout: answerLimit}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			var e bytes.Buffer
			_, _ = e.ReadFrom(resp.Body)
			t.Fatalf("%s: %d %s", tr.name, resp.StatusCode, e.String())
		}
	}
	post(httpScore1, "/v1/score", map[string]any{"model": model, "messages": chat})
	post(httpScore2, "/v1/score", map[string]any{"model": model, "messages": chat})
	post(httpPick, "/v1/pick", map[string]any{"model": model, "prompt": secretText, "candidates": candidates})

	conn, err := grpc.NewClient(d.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := kvindexv1.NewIndexerClient(conn)
	gctx := func(tr traced) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "traceparent", tr.header())
	}
	if _, err := c.Score(gctx(grpcScore), &kvindexv1.ScoreRequest{Model: model,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: toks}}}); err != nil {
		t.Fatal(err)
	}
	chatJSON, _ := json.Marshal(map[string]any{"messages": chat})
	picked, err := c.Pick(gctx(grpcPick), &kvindexv1.PickRequest{Model: model,
		Input:      &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: toks}},
		Candidates: []*kvindexv1.Candidate{{Pod: "pod-b"}, {Pod: "pod-a"}}})
	if err != nil {
		t.Fatal(err)
	}
	if picked.GetPod() != "pod-a" {
		t.Fatalf("gRPC pick chose %q, want pod-a (it holds the prefix)", picked.GetPod())
	}
	// gRPC chat too (render and tokenize under a gRPC parent).
	grpcChat := newTraced("grpc chat score", 6)
	if _, err := c.Score(gctx(grpcChat), &kvindexv1.ScoreRequest{Model: model,
		Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: string(chatJSON)}}); err != nil {
		t.Fatal(err)
	}

	// stages: the child spans of the request span each trace must have.
	type want struct {
		tr     traced
		server string
		stages []string
	}
	wants := []want{
		{httpScore1, "POST /v1/score", []string{"kvindex.chat.render", "kvindex.tokenize", "kvindex.keys", "kvindex.index.lookup"}},
		{httpScore2, "POST /v1/score", []string{"kvindex.chat.render", "kvindex.tokenize", "kvindex.keys", "kvindex.index.lookup"}},
		{httpPick, "POST /v1/pick", []string{"kvindex.tokenize", "kvindex.keys", "kvindex.index.lookup", "kvindex.pick"}},
		{grpcScore, "kvindex.v1.Indexer/Score", []string{"kvindex.keys", "kvindex.index.lookup"}},
		{grpcPick, "kvindex.v1.Indexer/Pick", []string{"kvindex.keys", "kvindex.index.lookup", "kvindex.pick"}},
		{grpcChat, "kvindex.v1.Indexer/Score", []string{"kvindex.chat.render", "kvindex.tokenize", "kvindex.keys", "kvindex.index.lookup"}},
	}
	spansOf := map[string]map[string]*tracepb.Span{}
	for _, w := range wants {
		wait.For(t, w.tr.name+" trace exported", func() bool {
			byName := map[string]*tracepb.Span{}
			for _, s := range rcv.trace(w.tr.trace) {
				byName[s.GetName()] = s
			}
			spansOf[w.tr.name] = byName
			if byName[w.server] == nil {
				return false
			}
			for _, st := range w.stages {
				if byName[st] == nil {
					return false
				}
			}
			return true
		})
		byName := spansOf[w.tr.name]
		srv := byName[w.server]
		if got := hex.EncodeToString(srv.GetParentSpanId()); got != w.tr.parent {
			t.Errorf("%s: request span's parent %s, want the caller's %s", w.tr.name, got, w.tr.parent)
		}
		if srv.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("%s: request span kind %v", w.tr.name, srv.GetKind())
		}
		if v, _ := attr(srv, "gen_ai.request.model"); v.GetStringValue() != model {
			t.Errorf("%s: gen_ai.request.model = %v", w.tr.name, v)
		}
		if rcv.svc[hex.EncodeToString(srv.GetSpanId())] != "kvindexd-under-test" {
			t.Errorf("%s: service.name %q, want OTEL_SERVICE_NAME's", w.tr.name, rcv.svc[hex.EncodeToString(srv.GetSpanId())])
		}
		for _, st := range w.stages {
			if !bytes.Equal(byName[st].GetParentSpanId(), srv.GetSpanId()) {
				t.Errorf("%s: %s is not a child of the request span", w.tr.name, st)
			}
		}
	}

	// Attributes the stages promise.
	intAttr := func(trName, span, key string) int64 {
		t.Helper()
		v, ok := attr(spansOf[trName][span], key)
		if !ok {
			t.Errorf("%s: %s has no %s", trName, span, key)
		}
		return v.GetIntValue()
	}
	if intAttr(httpScore2.name, "kvindex.tokenize", "kvindex.tokenize.reused_tokens") == 0 {
		t.Errorf("the repeated chat reused no tokens from the prefix store")
	}
	intAttr(httpScore1.name, "kvindex.tokenize", "kvindex.tokenize.reused_tokens")
	if intAttr(grpcScore.name, "kvindex.keys", "kvindex.blocks") != 4 {
		t.Errorf("grpc score: kvindex.blocks is not 4")
	}
	// The wait loop above scored the same tokens: the key cache holds them.
	if intAttr(grpcScore.name, "kvindex.keys", "kvindex.key_cache.hits") != 4 {
		t.Errorf("grpc score: the key cache did not hold the blocks scored before")
	}
	if intAttr(grpcScore.name, "kvindex.index.lookup", "kvindex.lookup.best_matched_blocks") != 4 {
		t.Errorf("grpc score: best match is not pod-a's 4 blocks")
	}
	pick := spansOf[grpcPick.name]["kvindex.pick"]
	for key, wantV := range map[string]string{"kvindex.pick.pod": "pod-a", "kvindex.pick.policy": picked.GetPolicy(), "kvindex.pick.reason": picked.GetReason()} {
		if v, _ := attr(pick, key); v.GetStringValue() != wantV {
			t.Errorf("grpc pick: %s = %v, want %q", key, v, wantV)
		}
	}
	if v, _ := attr(spansOf[grpcPick.name]["kvindex.v1.Indexer/Pick"], "rpc.system"); v.GetStringValue() != "grpc" {
		t.Errorf("grpc pick: rpc.system = %v", v)
	}
	if v, _ := attr(spansOf[httpPick.name]["POST /v1/pick"], "http.response.status_code"); v.GetIntValue() != 200 {
		t.Errorf("http pick: http.response.status_code = %v", v)
	}

	// The engine batch: a root span of its own with pod, seq and blocks.
	var batch *tracepb.Span
	wait.For(t, "event batch span", func() bool {
		for _, s := range rcv.named("kvindex.events.apply") {
			if v, _ := attr(s, "kvindex.pod"); v.GetStringValue() == "pod-a" {
				batch = s
				return true
			}
		}
		return false
	})
	if len(batch.GetParentSpanId()) != 0 {
		t.Errorf("batch span has a parent")
	}
	for key, wantV := range map[string]int64{"kvindex.events.seq": 1, "kvindex.blocks.stored": 4, "kvindex.events.count": 1} {
		if v, _ := attr(batch, key); v.GetIntValue() != wantV {
			t.Errorf("batch span: %s = %v, want %d", key, v, wantV)
		}
	}

	// Nothing a request sent leaves: no text, no token id, no id list.
	// Give the exporter one more flush, then read every span received.
	time.Sleep(200 * time.Millisecond)
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, b := range rcv.raw {
		if bytes.Contains(b, []byte("quokka")) {
			t.Fatalf("prompt text left in an exported span")
		}
	}
	ids := map[int64]bool{}
	for _, id := range toks {
		ids[int64(id)] = true
	}
	for _, s := range rcv.spans {
		for _, kv := range s.GetAttributes() {
			v := kv.GetValue()
			if v.GetArrayValue() != nil || v.GetBytesValue() != nil {
				t.Errorf("span %s: attribute %s is a list (token ids?)", s.GetName(), kv.GetKey())
			}
			if ids[v.GetIntValue()] {
				t.Errorf("span %s: attribute %s = %d is a token id of the request", s.GetName(), kv.GetKey(), v.GetIntValue())
			}
		}
		if len(s.GetEvents()) > 0 {
			t.Errorf("span %s has events (none are made; they could carry errors quoting a request)", s.GetName())
		}
	}
}
