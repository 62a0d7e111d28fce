package promises

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	readToken  = "3f0c9e0a1b2c3d4e5f60718293a4b5c6d7e8f9011223344556677889900aabb"
	adminToken = "9a71d20a1b2c3d4e5f60718293a4b5c6d7e8f9011223344556677889900aabb"
)

func tokenFile(t *testing.T) string {
	return writeFile(t, "tokens", "# scopes\n"+readToken+" read\n"+adminToken+"  admin\n")
}

func grpcClient(t *testing.T, d *harness.Daemon) (kvindexv1.IndexerClient, healthpb.HealthClient) {
	t.Helper()
	conn, err := grpc.NewClient(d.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return kvindexv1.NewIndexerClient(conn), healthpb.NewHealthClient(conn)
}

func withToken(token string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return ctx, cancel
}

// The auth scopes (--auth-token-file): probes and /metrics open, every other
// call needs a read token, endpoint management an admin token; refusals are
// 401/Unauthenticated (missing or unknown token) or 403/PermissionDenied
// (scope) and counted by transport and reason.
func TestPromiseAuthScopes(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--auth-token-file", tokenFile(t))
	endpoint := func() string {
		return fmt.Sprintf(`{"address":"tcp://127.0.0.1:%d","pod":"pod-x","model":"org/model"}`, harness.FreePort(t))
	}
	dynRegister := func() string {
		return fmt.Sprintf(`{"instance_id":%d,"endpoint":"tcp://127.0.0.1:%d","model_name":"org/model","block_size":16}`,
			harness.FreePort(t), harness.FreePort(t))
	}
	for _, c := range []struct {
		token, method, path, body string
		want                      int
	}{
		{"", "GET", "/healthz", "", 200},
		{"", "GET", "/readyz", "", 200},
		{"", "GET", "/metrics", "", 200},
		{"", "POST", "/v1/score", scoreBody, 401},
		{"not-a-configured-token-at-all", "POST", "/v1/score", scoreBody, 401},
		{readToken, "POST", "/v1/score", scoreBody, 200},
		{"", "GET", "/v1/pods", "", 401},
		{readToken, "GET", "/v1/pods", "", 200},
		{"", "GET", "/some/future/path", "", 401},
		{readToken, "POST", "/v1/endpoints", endpoint(), 403},
		{adminToken, "POST", "/v1/endpoints", endpoint(), 201},
		// Dynamo's runtime registration is endpoint management too.
		{readToken, "POST", "/register", dynRegister(), 403},
		{adminToken, "POST", "/register", dynRegister(), 201},
		{"", "GET", "/health", "", 200},
		{adminToken, "POST", "/v1/score", scoreBody, 200},
	} {
		d.Token = c.token
		code, body, hdr := d.Do(c.method, c.path, c.body)
		if code != c.want {
			t.Errorf("%s %s with token %.8q: %d %s, want %d", c.method, c.path, c.token, code, body, c.want)
		}
		if code == 401 && !strings.Contains(hdr.Get("WWW-Authenticate"), `Bearer realm="kvindexd"`) {
			t.Errorf("%s %s: 401 without WWW-Authenticate: %q", c.method, c.path, hdr.Get("WWW-Authenticate"))
		}
	}
	d.Token = ""

	ix, health := grpcClient(t, d)
	score := &kvindexv1.ScoreRequest{Model: model, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt(1, 1)}}}
	for _, c := range []struct {
		token string
		want  codes.Code
	}{{"", codes.Unauthenticated}, {"not-a-configured-token-at-all", codes.Unauthenticated}, {readToken, codes.OK}} {
		ctx, cancel := withToken(c.token)
		_, err := ix.Score(ctx, score)
		cancel()
		if status.Code(err) != c.want {
			t.Errorf("gRPC Score with token %.8q: %v, want %v", c.token, err, c.want)
		}
	}
	add := &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{Address: fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t)), Pod: "pod-y", Model: model}}
	for _, c := range []struct {
		token string
		want  codes.Code
	}{{readToken, codes.PermissionDenied}, {adminToken, codes.OK}} {
		ctx, cancel := withToken(c.token)
		_, err := ix.AddEndpoint(ctx, add)
		cancel()
		if status.Code(err) != c.want {
			t.Errorf("gRPC AddEndpoint with token %.8q: %v, want %v", c.token, err, c.want)
		}
	}
	ctx, cancel := withToken("")
	defer cancel()
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC health without a token: %v", err)
	}

	for _, c := range []struct {
		series string
		want   float64
	}{
		{`kvindexd_auth_denied_total{reason="missing_token",transport="http"}`, 3},
		{`kvindexd_auth_denied_total{reason="bad_token",transport="http"}`, 1},
		{`kvindexd_auth_denied_total{reason="scope",transport="http"}`, 2},
		{`kvindexd_auth_denied_total{reason="missing_token",transport="grpc"}`, 1},
		{`kvindexd_auth_denied_total{reason="bad_token",transport="grpc"}`, 1},
		{`kvindexd_auth_denied_total{reason="scope",transport="grpc"}`, 1},
	} {
		if v := d.Metric(c.series); v != c.want {
			t.Errorf("%s = %v, want %v", c.series, v, c.want)
		}
	}
}

// --metrics-auth: /metrics needs a read token too.
func TestPromiseMetricsAuth(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--auth-token-file", tokenFile(t), "--metrics-auth")
	if code, _ := d.Get("/metrics"); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401", code)
	}
	d.Token = readToken
	if code, _ := d.Get("/metrics"); code != http.StatusOK {
		t.Errorf("/metrics with a read token: %d, want 200", code)
	}
	d.Token = ""
	if code, _ := d.Get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz without a token: %d, want 200", code)
	}
}

// Endpoint management is off by default: 403 / PermissionDenied naming the
// flag, counted as admin_off.
func TestPromiseAdminAPIOff(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	code, body, _ := d.Do("POST", "/v1/endpoints", `{"address":"tcp://127.0.0.1:1","pod":"p"}`)
	if code != http.StatusForbidden || !strings.Contains(body, "--admin-api") {
		t.Errorf("POST /v1/endpoints: %d %s, want 403 naming --admin-api", code, body)
	}
	ix, _ := grpcClient(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ix.AddEndpoint(ctx, &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{Address: "tcp://127.0.0.1:1", Pod: "p"}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("gRPC AddEndpoint: %v, want PermissionDenied", err)
	}
	if v := d.Metric(`kvindexd_auth_denied_total{reason="admin_off"}`); v != 2 {
		t.Errorf(`kvindexd_auth_denied_total{reason="admin_off"} = %v, want 2`, v)
	}
}

// --admin-api: endpoint management is served; a body that is not JSON is
// 415, an address that is not tcp://host:port or ipc://path is 400.
func TestPromiseAdminAPI(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--admin-api")
	req, _ := http.NewRequest("POST", "http://"+d.HTTP+"/v1/endpoints", strings.NewReader(`{"address":"tcp://127.0.0.1:1","pod":"p"}`))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain body: %d, want 415", resp.StatusCode)
	}
	for _, addr := range []string{"udp://127.0.0.1:5557", "tcp://*:5557", "tcp://user:pass@127.0.0.1:5557", "inproc://x", "ipc://@abstract"} {
		if code, body, _ := d.Do("POST", "/v1/endpoints", `{"address":"`+addr+`","pod":"p"}`); code != http.StatusBadRequest {
			t.Errorf("address %s: %d %s, want 400", addr, code, body)
		}
	}
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	if code, body, _ := d.Do("POST", "/v1/endpoints", `{"address":"`+addr+`","pod":"p"}`); code != http.StatusCreated {
		t.Errorf("address %s: %d %s, want 201", addr, code, body)
	}
}
