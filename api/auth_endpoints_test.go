package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	indexerv1 "github.com/kvindex/kvindex/proto/llmd/indexer/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// These tests pin the API's edges: first the access guard, the token file and the endpoint policy
// at their exact edges, then the score-body key scanner, the connection
// metrics and the gRPC surfaces. Each fails on the mutant named in its
// comment (applied by hand and reverted; equivalents in EQUIVALENT.md).

// A token of exactly MinTokenLen characters is accepted and one character
// less is refused (kills `len(f[0]) < MinTokenLen` -> `<=`).
func TestTokenMinLengthEdge(t *testing.T) {
	exact := strings.Repeat("k", MinTokenLen)
	tok, err := LoadTokens(writeTokens(t, exact+" read\n"), nil)
	if err != nil {
		t.Fatalf("token of exactly %d characters refused: %v", MinTokenLen, err)
	}
	if tok.Check(exact) != ScopeRead {
		t.Fatalf("token of exactly %d characters does not authenticate", MinTokenLen)
	}
	if _, err := LoadTokens(writeTokens(t, exact[1:]+" read\n"), nil); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Fatalf("token of %d characters: %v, want shorter-than error", MinTokenLen-1, err)
	}
}

// A token file error names the line it is on, counting blank and comment
// lines, so an operator can find it without the token being echoed (kills
// the line counter `n++` -> `n--`).
func TestTokenFileErrorNamesTheLine(t *testing.T) {
	content := "# comment\n\n" + readToken + " read\n" + adminToken + " superuser\n"
	_, err := LoadTokens(writeTokens(t, content), nil)
	if err == nil || !strings.Contains(err.Error(), "line 4:") {
		t.Fatalf("bad scope on line 4: %v, want an error naming line 4", err)
	}
}

// LoadTokens keeps the logger it is given (reload failures are reported
// there) and uses a working one when given nil (kills `log == nil` -> `!=`,
// which would drop the caller's logger and keep a nil one).
func TestLoadTokensKeepsTheLogger(t *testing.T) {
	var buf bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&buf, nil))
	p := writeTokens(t, readToken+" read\n")
	tok, err := LoadTokens(p, lg)
	if err != nil {
		t.Fatal(err)
	}
	if tok.log != lg {
		t.Error("LoadTokens replaced the logger it was given")
	}
	tok, err = LoadTokens(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok.log == nil {
		t.Fatal("LoadTokens(nil logger) keeps a nil logger: a failed reload would panic")
	}
	tok.log.Error("must not panic")
}

// Ports 1 and 65535 are valid, 0 and 65536 are not (kills `n < 1` -> `<= 1`
// and `n > 65535` -> `>= 65535`).
func TestEndpointPortEdges(t *testing.T) {
	for addr, ok := range map[string]bool{
		"tcp://10.0.0.7:1":     true,
		"tcp://10.0.0.7:65535": true,
		"tcp://10.0.0.7:0":     false,
		"tcp://10.0.0.7:65536": false,
		"tcp://10.0.0.7:-1":    false,
	} {
		if err := DefaultEndpointPolicy.Check(context.Background(), addr); (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", addr, err, ok)
		}
	}
}

// A body of exactly MaxBodyBytes is served, one byte more is refused before
// the handler runs (kills `r.ContentLength > max` -> `>=`).
func TestMaxBodyBytesEdge(t *testing.T) {
	score := `{"model":"m","token_ids":[1,2,3,4]}`
	limit := int64(len(score) + 8)
	g := newGuarded(t, Config{MaxBodyBytes: limit})
	exact := score + strings.Repeat(" ", int(limit)-len(score))
	if code, _, body := g.do(t, "POST", "/v1/score", "", "", exact); code != http.StatusOK {
		t.Errorf("body of exactly the limit (%d bytes): %d %s, want 200", limit, code, body)
	}
	if code, _, body := g.do(t, "POST", "/v1/score", "", "", exact+" "); code == http.StatusOK || !strings.Contains(body, "above the limit") {
		t.Errorf("body one byte above the limit: %d %s, want refused as above the limit", code, body)
	}
}

// logCount counts s in a log.
func logCount(b *logtest.Buffer, s string) int { return strings.Count(b.String(), s) }

// Watch applies a rotated token file once, logs "reloaded" only when the
// tokens changed, and logs a file that stops parsing while keeping the
// tokens loaded before (kills `err != nil` -> `==` and `!= before` -> `==`
// in Watch: either logs on every unchanged tick).
func TestTokenWatchReloadsAndLogs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	watch := func(tok *Tokens) {
		wg.Add(1)
		go func() { defer wg.Done(); tok.Watch(ctx, time.Millisecond) }()
	}

	logs := &logtest.Buffer{}
	p := writeTokens(t, readToken+" read\n")
	tok, err := LoadTokens(p, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	watch(tok)

	// Let the watcher see its unchanged file on about 20 ticks. On a slow
	// machine it may see fewer: then a mutant may escape, but the unmutated
	// code cannot fail here.
	tk := time.NewTicker(time.Millisecond)
	for range 20 {
		<-tk.C
	}
	tk.Stop()
	if n := logCount(logs, "token file reloaded") + logCount(logs, "reload failed"); n != 0 {
		t.Fatalf("an unchanged token file was logged %d times:\n%s", n, logs)
	}

	if err := os.WriteFile(p, []byte(readToken+" read\n"+adminToken+" admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the rotated token file", func() bool { return tok.Check(adminToken) == ScopeAdmin })
	wait.For(t, "the reload log line", func() bool { return logCount(logs, "token file reloaded") == 1 })
	if logCount(logs, "tokens=2") != 1 {
		t.Errorf("reload log does not count the 2 tokens")
	}

	if err := os.WriteFile(p, []byte("garbage that does not parse at all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the reload failure log line", func() bool { return logCount(logs, "reload failed") > 0 })
	if tok.Check(adminToken) != ScopeAdmin || tok.Check(readToken) != ScopeRead {
		t.Error("a token file that stopped parsing dropped the tokens loaded before")
	}
	if n := logCount(logs, "token file reloaded"); n != 1 {
		t.Errorf("token file logged as reloaded %d times, want 1", n)
	}
}

// A rewrite seen half-way (stamped while truncated, read when whole) loads
// the new tokens once: the next tick's new stamp over the same content is
// not a second reload (TestTokenWatchReloadsAndLogs counted two "reloaded"
// lines once under -race).
func TestTokenReloadStaleStampSameContent(t *testing.T) {
	p := writeTokens(t, readToken+" read\n")
	tok, err := LoadTokens(p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(readToken+" read\n"+adminToken+" admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tok.reload(false); err != nil {
		t.Fatal(err)
	}
	loaded := tok.set.Load()
	tok.mu.Lock()
	tok.stamp = fileStamp{} // as if stamped while the file was truncated
	tok.mu.Unlock()
	if err := tok.reload(false); err != nil {
		t.Fatal(err)
	}
	if tok.set.Load() != loaded {
		t.Error("the same content was loaded again under a new stamp")
	}
	if tok.Check(adminToken) != ScopeAdmin {
		t.Error("the rotated tokens are not served")
	}
}

// Over HTTP/2 (what kvindexd serves with TLS) a request without a body has
// ContentLength 0 but a Body that is not http.NoBody: a DELETE of an
// endpoint, which carries no body and no Content-Type, must not be refused
// as "not JSON" (kills hasBody's `r.ContentLength < 0` -> `<= 0`).
func TestAdminDeleteWithoutBodyOverHTTP2(t *testing.T) {
	g := newGuarded(t, Config{AdminAPI: true})
	ts := httptest.NewUnstartedServer(g.srv.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	do := func(method, path, ctype, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body == "" {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s %s served over %s, want HTTP/2", method, path, resp.Proto)
		}
		if resp.StatusCode >= 300 {
			t.Logf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return resp.StatusCode
	}
	if code := do("POST", "/v1/endpoints", "application/json", `{"address":"tcp://10.0.0.7:5557","pod":"p"}`); code != http.StatusCreated {
		t.Fatalf("POST /v1/endpoints over HTTP/2: %d, want 201", code)
	}
	if code := do("DELETE", "/v1/endpoints?address=tcp://10.0.0.7:5557", "", ""); code != http.StatusNoContent {
		t.Errorf("DELETE /v1/endpoints without a body over HTTP/2: %d, want 204", code)
	}
	// A body that is there is still checked over HTTP/2.
	if code := do("POST", "/v1/endpoints", "text/plain", `{"address":"tcp://10.0.0.8:5557"}`); code != http.StatusUnsupportedMediaType {
		t.Errorf("POST text/plain over HTTP/2: %d, want 415", code)
	}
}

// NewConnMetrics puts both connection metrics on the registry it is given
// (the LimitListener's labels make them appear) and works without one
// (kills `reg != nil` -> `==`).
func TestConnMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewConnMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer LimitListener(ln, 1, "http", m).Close()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"kvindexd_open_connections", "kvindexd_connections_limited_total", "kvindexd_connections_evicted_total"} {
		if !got[name] {
			t.Errorf("%s is not on the registry given to NewConnMetrics", name)
		}
	}
	if _, err := NewConnMetrics(nil); err != nil {
		t.Errorf("NewConnMetrics(nil): %v", err)
	}
}

// Known keys of a score body take key()'s no-allocation path: a reused
// body parses without allocating (kills the fast path's `!= '"'`,
// `!= '\\'` and `>= 0x20` negated, which send every key through str()).
func TestScoreBodyKnownKeysDoNotAllocate(t *testing.T) {
	data := []byte(`{"model":"m","token_ids":[1,2,3,4],"pods":["a"],"lora_name":"l"}`)
	var b scoreBody
	if err := parseScoreBody(data, &b); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() {
		if err := parseScoreBody(data, &b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("parsing a score body with known keys: %v allocations, want 0", n)
	}
}

// A known key cut short by a byte that is not its closing quote is bad
// JSON, not that key (kills key()'s `s.b[s.p] == '"'` -> `!=`, which took
// `"model\:` as the key model and skipped the stray byte).
func TestScoreBodyKeyNotClosedByQuote(t *testing.T) {
	for _, data := range []string{
		`{"model\:"m","token_ids":[1]}`,
		"{\"model\x01:\"m\",\"token_ids\":[1]}",
		"{\"model\x80:\"m\",\"token_ids\":[1]}",
	} {
		var b scoreBody
		if err := parseScoreBody([]byte(data), &b); err == nil {
			t.Errorf("%q: accepted (model %q), want an error", data, b.model)
		}
	}
}

// Endpoint management over gRPC: add, list, remove, and the errors of
// removing an unknown address and of listing without a subscriber (kills
// the `err != nil` negations of RemoveEndpoint and ListEndpoints).
func TestGRPCEndpointManagement(t *testing.T) {
	g := newGuarded(t, Config{AdminAPI: true})
	cl := kvindexv1.NewIndexerClient(g.conn)
	ctx := context.Background()
	const addr = "tcp://10.0.0.7:5557"
	if _, err := cl.AddEndpoint(ctx, &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{Address: addr, Pod: "p"}}); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		t.Helper()
		r, err := cl.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{})
		if err != nil {
			t.Fatalf("ListEndpoints: %v", err)
		}
		var out []string
		for _, e := range r.GetEndpoints() {
			out = append(out, e.GetAddress()+" "+e.GetPod())
		}
		return out
	}
	if got := list(); len(got) != 1 || got[0] != addr+" p" {
		t.Fatalf("ListEndpoints after add: %q", got)
	}
	if _, err := cl.RemoveEndpoint(ctx, &kvindexv1.RemoveEndpointRequest{Address: addr}); err != nil {
		t.Fatalf("RemoveEndpoint: %v", err)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("ListEndpoints after remove: %q", got)
	}
	if _, err := cl.RemoveEndpoint(ctx, &kvindexv1.RemoveEndpointRequest{Address: addr}); status.Code(err) != codes.NotFound {
		t.Errorf("RemoveEndpoint of an unknown address: %v, want NotFound", err)
	}

	idx, err := indexer.New(ctx, indexer.Config{Keys: testKeys})
	if err != nil {
		t.Fatal(err)
	}
	bare, err := New(Config{Indexer: idx, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ListEndpoints without a subscriber: %v, want Unimplemented", err)
	}
}

// llm-d's GetPodScores reports data_parallel_rank only for a pod that has
// data-parallel ranks: a best rank other than 0, several matching ranks, or
// several ranks seen (kills the negations and boundaries of that test).
func TestLLMDDataParallelRank(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys, Tokenizer: echoPrompt{}})
	const prompt = "abcdefgh" // two blocks of testBlock echo tokens
	toks := echoPrompt{}.ids(prompt)
	st.store("pod-a", 0, event.TierGPU, toks, 2, blockkeys.RequestExtras{}) // one rank
	st.store("pod-b", 2, event.TierGPU, toks, 2, blockkeys.RequestExtras{}) // one rank, not 0
	st.store("pod-c", 0, event.TierGPU, toks, 2, blockkeys.RequestExtras{}) // two matching ranks
	st.store("pod-c", 1, event.TierGPU, toks, 1, blockkeys.RequestExtras{})
	st.store("pod-d", 0, event.TierGPU, toks, 2, blockkeys.RequestExtras{}) // two ranks, one matching
	st.store("pod-d", 1, event.TierGPU, seqTokens(1000, 8), 2, blockkeys.RequestExtras{})
	resp, err := st.llmd.GetPodScores(context.Background(), &indexerv1.GetPodScoresRequest{Prompt: prompt, ModelName: testModel})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range resp.GetScores() {
		r := "unset"
		if s.DataParallelRank != nil {
			r = strconv.Itoa(int(s.GetDataParallelRank()))
		}
		got[s.GetPod()] = r
	}
	want := map[string]string{"pod-a": "unset", "pod-b": "2", "pod-c": "0", "pod-d": "0"}
	for pod, w := range want {
		if got[pod] != w {
			t.Errorf("%s: data_parallel_rank %s, want %s (all: %v)", pod, got[pod], w, got)
		}
	}
}

// With CIDRs set, a host name is resolved under a deadline that is bounded
// but still ahead (resolveTimeout `*` -> `/` would make it 0), and a lookup
// error refuses the address with the reason.
func TestEndpointPolicyResolveDeadlineAndError(t *testing.T) {
	cidrs, err := ParseCIDRs([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	p := &EndpointPolicy{AllowedCIDRs: cidrs, Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) <= 0 || time.Until(dl) > resolveTimeout {
			return nil, errors.New("lookup without a usable deadline")
		}
		if host == "broken.svc" {
			return nil, errors.New("no such host")
		}
		return []netip.Addr{netip.MustParseAddr("10.0.0.9")}, nil
	}}
	if err := p.Check(context.Background(), "tcp://inside.svc:5557"); err != nil {
		t.Errorf("name inside the CIDRs: %v", err)
	}
	if err := p.Check(context.Background(), "tcp://broken.svc:5557"); err == nil || !strings.Contains(err.Error(), "resolve host: no such host") {
		t.Errorf("failed lookup: %v, want refused with the lookup error", err)
	}
}
