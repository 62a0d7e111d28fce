package api

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

const (
	readToken  = "read-token-0123456789abcdef"
	adminToken = "admin-token-0123456789abcdef"
)

func writeTokens(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenFileErrorsNeverEchoTheToken(t *testing.T) {
	for content, reason := range map[string]string{
		"":                                "no token",
		"# only a comment\n":              "no token",
		"short read\n":                    "shorter than 16",
		"secret-secret-secret superuser":  `scope "superuser"`,
		"secret-secret-secret read extra": "want",
		"secret-secret-secret read\nsecret-secret-secret admin\n": "listed twice",
	} {
		_, err := LoadTokens(writeTokens(t, content), nil)
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("%q: %v, want an error with %q", content, err, reason)
			continue
		}
		if strings.Contains(err.Error(), "secret-secret") || strings.Contains(err.Error(), "short") && !strings.Contains(reason, "short") {
			t.Errorf("%q: the token is in the error: %v", content, err)
		}
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Error("missing token file: no error")
	}
}

// A changed token file is picked up; one that stops parsing keeps the
// tokens loaded before.
func TestTokenFileReload(t *testing.T) {
	p := writeTokens(t, readToken+" read\n")
	tok, err := LoadTokens(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Check(readToken) != ScopeRead || tok.Check(adminToken) != ScopeNone || tok.HasAdmin() {
		t.Fatal("initial scopes wrong")
	}
	if err := os.WriteFile(p, []byte("# rotated\n"+adminToken+" admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tok.reload(false); err != nil {
		t.Fatal(err)
	}
	if tok.Check(readToken) != ScopeNone || tok.Check(adminToken) != ScopeAdmin || !tok.HasAdmin() {
		t.Fatal("rotated token file not applied")
	}
	if err := os.WriteFile(p, []byte("garbage that does not parse at all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tok.reload(false); err == nil {
		t.Fatal("broken token file reloaded without error")
	}
	if tok.Check(adminToken) != ScopeAdmin {
		t.Fatal("a broken token file dropped the tokens loaded before")
	}
}

// guarded serves a real indexer behind the guard over HTTP and gRPC.
type guarded struct {
	srv  *Server
	http *httptest.Server
	conn *grpc.ClientConn
}

func newGuarded(t *testing.T, cfg Config) *guarded {
	t.Helper()
	idx, err := indexer.New(context.Background(), indexer.Config{Keys: testKeys})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Indexer, cfg.Subscriber, cfg.Logger = idx, &fakeSubscriber{}, slog.New(slog.DiscardHandler)
	cfg.Registry = prometheus.NewRegistry()
	g := &guarded{}
	if g.srv, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	g.http = httptest.NewServer(g.srv.Handler())
	t.Cleanup(g.http.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := g.srv.NewGRPCServer()
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	if g.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.conn.Close() })
	return g
}

func (g *guarded) do(t *testing.T, method, path, token, ctype, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, g.http.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestHTTPScopes(t *testing.T) {
	tok, err := LoadTokens(writeTokens(t, readToken+" read\n"+adminToken+" admin\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, metricsAuth := range []bool{false, true} {
		g := newGuarded(t, Config{Auth: tok, MetricsAuth: metricsAuth})
		score := `{"model":"m","token_ids":[1,2,3,4]}`
		ep := `{"address":"tcp://10.0.0.7:5557","pod":"p"}`
		metricsCode := http.StatusOK
		if metricsAuth {
			metricsCode = http.StatusUnauthorized
		}
		for _, c := range []struct {
			method, path, token, ctype, body string
			code                             int
		}{
			{"GET", "/healthz", "", "", "", 200},
			{"GET", "/readyz", "", "", "", 200},
			{"GET", "/metrics", "", "", "", metricsCode},
			{"GET", "/metrics", readToken, "", "", 200},
			{"POST", "/v1/score", "", "", score, 401},
			{"POST", "/v1/score", "not-a-valid-token-at-all", "", score, 401},
			{"POST", "/v1/score", readToken, "", score, 200},
			{"POST", "/v1/score", adminToken, "", score, 200},
			{"GET", "/v1/pods", "", "", "", 401},
			{"GET", "/v1/pods", readToken, "", "", 200},
			{"GET", "/v1/endpoints", readToken, "", "", 200},
			{"GET", "/some/future/path", "", "", "", 401},
			// The status page is served without a token (a browser cannot
			// send one when it opens a URL); every call it makes for data
			// still needs one.
			{"GET", "/", "", "", "", 200},
			{"HEAD", "/", "", "", "", 200},
			{"GET", "/?model=m&prompt=hello", "", "", "", 200},
			{"POST", "/", "", "", "", 401},
			{"GET", "/index.html", "", "", "", 401},
			{"GET", "/v1/status", "", "", "", 401},
			{"GET", "/v1/status", readToken, "", "", 200},
			{"GET", "/v1/models", "", "", "", 401},
			{"GET", "/v1/endpoints", "", "", "", 401},
			{"POST", "/v1/endpoints", "", "application/json", ep, 401},
			{"POST", "/v1/endpoints", readToken, "application/json", ep, 403},
			{"POST", "/v1/endpoints", adminToken, "text/plain", ep, 415},
			{"POST", "/v1/endpoints", adminToken, "application/x-www-form-urlencoded", ep, 415},
			{"POST", "/v1/endpoints", adminToken, "application/json; charset=utf-8", ep, 201},
			{"DELETE", "/v1/endpoints?address=tcp://10.0.0.7:5557", readToken, "", "", 403},
			{"DELETE", "/v1/endpoints?address=tcp://10.0.0.7:5557", adminToken, "", "", 204},
		} {
			code, h, body := g.do(t, c.method, c.path, c.token, c.ctype, c.body)
			if code != c.code {
				t.Errorf("metricsAuth=%v %s %s token=%q ctype=%q: %d %s, want %d", metricsAuth, c.method, c.path,
					c.token, c.ctype, code, body, c.code)
			}
			if code == 401 && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s: 401 without WWW-Authenticate: Bearer", c.method, c.path)
			}
			if strings.Contains(body, readToken) || strings.Contains(body, adminToken) {
				t.Errorf("%s %s: a token is echoed: %s", c.method, c.path, body)
			}
		}
	}
}

// Without --admin-api and without an admin token, endpoint management is
// refused on both transports, authenticated or not; --admin-api turns it on.
func TestAdminAPIOffByDefault(t *testing.T) {
	ep := `{"address":"tcp://10.0.0.7:5557"}`
	tok, err := LoadTokens(writeTokens(t, readToken+" read\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{{}, {Auth: tok}} {
		g := newGuarded(t, cfg)
		if code, _, body := g.do(t, "POST", "/v1/endpoints", readToken, "application/json", ep); code != 403 || !strings.Contains(body, "--admin-api") {
			t.Errorf("auth=%v: POST %d %s, want 403 naming --admin-api", cfg.Auth != nil, code, body)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+readToken)
		_, err := kvindexv1.NewIndexerClient(g.conn).AddEndpoint(ctx, &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{Address: "tcp://10.0.0.7:5557"}})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("auth=%v: gRPC AddEndpoint: %v, want PermissionDenied", cfg.Auth != nil, err)
		}
		if code, _, _ := g.do(t, "POST", "/v1/score", readToken, "", `{"model":"m","token_ids":[1]}`); code != 200 {
			t.Errorf("score refused: %d", code)
		}
	}
	g := newGuarded(t, Config{AdminAPI: true})
	if code, _, body := g.do(t, "POST", "/v1/endpoints", "", "application/json", ep); code != 201 {
		t.Errorf("--admin-api: POST %d %s", code, body)
	}
}

func TestGRPCScopes(t *testing.T) {
	tok, err := LoadTokens(writeTokens(t, readToken+" read\n"+adminToken+" admin\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := newGuarded(t, Config{Auth: tok})
	cl := kvindexv1.NewIndexerClient(g.conn)
	with := func(token string) context.Context {
		if token == "" {
			return context.Background()
		}
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	}
	if _, err := healthpb.NewHealthClient(g.conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without a token: %v", err)
	}
	// A stream method is guarded too (the stream interceptor).
	w, err := healthpb.NewHealthClient(g.conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if err != nil {
		t.Errorf("health watch without a token: %v", err)
	}
	score := &kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2, 3, 4}}}}
	add := &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{Address: "tcp://10.0.0.7:5557"}}
	for _, c := range []struct {
		token string
		call  func(ctx context.Context) error
		code  codes.Code
	}{
		{"", func(ctx context.Context) error { _, err := cl.Score(ctx, score); return err }, codes.Unauthenticated},
		{"wrong-token-wrong-token", func(ctx context.Context) error { _, err := cl.Score(ctx, score); return err }, codes.Unauthenticated},
		{readToken, func(ctx context.Context) error { _, err := cl.Score(ctx, score); return err }, codes.OK},
		{readToken, func(ctx context.Context) error { _, err := cl.ListPods(ctx, &kvindexv1.ListPodsRequest{}); return err }, codes.OK},
		{readToken, func(ctx context.Context) error { _, err := cl.AddEndpoint(ctx, add); return err }, codes.PermissionDenied},
		{adminToken, func(ctx context.Context) error { _, err := cl.AddEndpoint(ctx, add); return err }, codes.OK},
		{readToken, func(ctx context.Context) error {
			_, err := cl.RemoveEndpoint(ctx, &kvindexv1.RemoveEndpointRequest{Address: "tcp://10.0.0.7:5557"})
			return err
		}, codes.PermissionDenied},
	} {
		if err := c.call(with(c.token)); status.Code(err) != c.code {
			t.Errorf("token %q: %v, want %v", c.token, err, c.code)
		}
	}
}

func TestEndpointPolicy(t *testing.T) {
	def := DefaultEndpointPolicy
	for addr, ok := range map[string]bool{
		"tcp://10.0.0.7:5557":      true,
		"tcp://engine-0.svc:5557":  true,
		"tcp://[fd00::7]:5557":     true,
		"ipc:///tmp/kv.sock":       true,
		"foo://10.0.0.7:5557":      false,
		"udp://10.0.0.7:5557":      false,
		"inproc://x":               false,
		"pgm://eth0;239.1.1.1:1":   false,
		"10.0.0.7:5557":            false,
		"tcp://*:5557":             false,
		"tcp://:5557":              false,
		"tcp://10.0.0.7":           false,
		"tcp://10.0.0.7:0":         false,
		"tcp://10.0.0.7:70000":     false,
		"tcp://10.0.0.7:http":      false,
		"tcp://eth0;10.0.0.7:5557": false,
		"tcp://u:pw9@10.0.0.7:1":   false,
		"ipc://":                   false,
		"tcp://10.0.0.7:5557 x":    false,
	} {
		err := def.Check(context.Background(), addr)
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", addr, err, ok)
		}
		if err != nil && strings.Contains(err.Error(), "pw9") {
			t.Errorf("%q: the password is in the error: %v", addr, err)
		}
	}
	cidrs, err := ParseCIDRs([]string{"10.0.0.0/8", "fd00::/8", "192.168.1.5"})
	if err != nil {
		t.Fatal(err)
	}
	p := &EndpointPolicy{AllowedCIDRs: cidrs, Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
		return fakeDNS[host], nil
	}}
	for addr, ok := range map[string]bool{
		"tcp://10.1.2.3:5557":          true,
		"tcp://[::ffff:10.0.0.1]:5557": true,
		"tcp://192.168.1.5:5557":       true,
		"tcp://192.168.1.6:5557":       false,
		"tcp://127.0.0.1:5557":         false,
		"tcp://[fd00::7]:5557":         true,
		"tcp://inside.svc:5557":        true,
		"tcp://mixed.svc:5557":         false,
		"tcp://unknown.svc:5557":       false,
		"ipc:///tmp/kv.sock":           true,
	} {
		if err := p.Check(context.Background(), addr); (err == nil) != ok {
			t.Errorf("CIDRs: %q: %v, want ok=%v", addr, err, ok)
		}
	}
	if err := p.CheckEndpoint(context.Background(), "tcp://10.1.2.3:5557", "tcp://127.0.0.1:5558", ""); err == nil || !strings.Contains(err.Error(), "replay") {
		t.Errorf("replay address outside the CIDRs: %v", err)
	}
	if err := p.CheckEndpoint(context.Background(), "tcp://10.1.2.3:5557", "", "tcp://127.0.0.1:5559"); err == nil || !strings.Contains(err.Error(), "snapshot address") {
		t.Errorf("snapshot address outside the CIDRs: %v", err)
	}
	if err := p.CheckEndpoint(context.Background(), "tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558", "tcp://inside.svc:5559"); err != nil {
		t.Errorf("every address inside the CIDRs: %v", err)
	}
	if _, err := ParseCIDRs([]string{"10.0.0.0/33"}); err == nil {
		t.Error("bad CIDR accepted")
	}
}

var fakeDNS = map[string][]netip.Addr{
	"inside.svc": {netip.MustParseAddr("10.9.9.9")},
	"mixed.svc":  {netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("8.8.8.8")},
}
