package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/internal/testkit/testcerts"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

const (
	secretPW   = "pw-S3CRET-9f8e"
	readToken  = "read-token-0123456789abcdef"
	adminToken = "admin-token-0123456789abcdef"
)

// No secret reaches a log line or an answer: a Redis URL with a password
// (Redis down, so the daemon logs its retries), endpoint and replay
// addresses with credentials given over HTTP, gRPC and the config. Every
// captured log line and every answer is searched for the password.
func TestNoSecretInLogsOrErrors(t *testing.T) {
	logs := &logtest.Buffer{}
	var answers []string
	index := fmt.Sprintf("redis://kv:%s@127.0.0.1:%d/0", secretPW, harness.FreePort(t))

	// Config errors on the way in.
	for _, args := range [][]string{
		{"--endpoint", "tcp://u:" + secretPW + "@10.0.0.7:5557"},
		{"--endpoint", "udp://u:" + secretPW + "@10.0.0.7:5557"},
		{"--endpoint", "tcp://10.0.0.7:5557,replay=tcp://u:" + secretPW + "@10.0.0.7:5558"},
		{"--endpoint", "tcp://10.0.0.7:5557,engine=sglang,snapshot=tcp://u:" + secretPW + "@10.0.0.7:5559"},
		{"--endpoint", "tcp://u:" + secretPW + "@10.0.0.7:5557,colour=blue"},
		{"--index", "redis://kv:" + secretPW + "@h:badport/0"},
	} {
		var out bytes.Buffer
		code := run(append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--zmq-bind", "tcp://127.0.0.1:0"}, args...), strings.NewReader(""), &out, &out)
		if code == 0 {
			t.Errorf("%v: the daemon started", args)
		}
		answers = append(answers, out.String())
	}

	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.ZMQBind = "127.0.0.1:0", "127.0.0.1:0", "tcp://127.0.0.1:0"
	cfg.HashSeed, cfg.Index, cfg.AdminAPI = "0", index, true
	ctx, cancel := context.WithCancel(context.Background())
	d, err := newDaemon(ctx, cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		all := logs.String() + strings.Join(answers, "\n")
		if strings.Contains(all, secretPW) {
			t.Errorf("the password leaked:\n%s", all)
		}
		if !strings.Contains(logs.String(), "kvindexd running") {
			t.Errorf("no daemon log captured:\n%s", logs.String())
		}
	}()

	post := func(body string) {
		req, _ := http.NewRequest("POST", "http://"+d.HTTPAddr()+"/v1/endpoints", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: %d %s, want 400", body, resp.StatusCode, b)
		}
		answers = append(answers, string(b))
	}
	post(`{"address":"tcp://u:` + secretPW + `@10.0.0.7:5557"}`)
	post(`{"address":"foo://u:` + secretPW + `@10.0.0.7:5557"}`)
	post(`{"address":"tcp://10.0.0.7:5557","replay_address":"tcp://u:` + secretPW + `@10.0.0.7:5558"}`)
	post(`{"address":"tcp://10.0.0.7:5557","snapshot_address":"tcp://u:` + secretPW + `@10.0.0.7:5559"}`)
	resp, err := http.Post("http://"+d.HTTPAddr()+"/v1/score", "application/json", strings.NewReader(`{"model":"m","token_ids":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	answers = append(answers, string(b))

	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = kvindexv1.NewIndexerClient(conn).AddEndpoint(context.Background(), &kvindexv1.AddEndpointRequest{
		Endpoint: &kvindexv1.Endpoint{Address: "tcp://u:" + secretPW + "@10.0.0.7:5557"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC AddEndpoint with credentials: %v", err)
	}
	answers = append(answers, fmt.Sprint(err))
	_, err = kvindexv1.NewIndexerClient(conn).AddEndpoint(context.Background(), &kvindexv1.AddEndpointRequest{
		Endpoint: &kvindexv1.Endpoint{Address: "tcp://10.0.0.7:5557", SnapshotAddress: "tcp://u:" + secretPW + "@10.0.0.7:5559"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC AddEndpoint with credentials in the snapshot address: %v", err)
	}
	answers = append(answers, fmt.Sprint(err))
	// Let the Redis client log a few failed health checks.
	time.Sleep(1500 * time.Millisecond)
}

// The daemon over TLS with mutual TLS and bearer tokens, as an operator
// configures it: probes answer without a token, scores need a read token
// (HTTP header or gRPC per-RPC metadata), the admin API is on because an
// admin token exists, and a client without a certificate is refused.
func TestDaemonTLSAndTokens(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "kvindexd-test-ca")
	certFile, keyFile, caFile := ca.WriteServerFiles(t, dir, 1)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("# kvindexd tokens\n"+readToken+" read\n"+adminToken+" admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startInProcess(t, func(c *Config) {
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile, c.AuthTokenFile = certFile, keyFile, caFile, tokens
	})
	tlsCfg := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.ClientCert(t)}}
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer cl.CloseIdleConnections()
	base := "https://" + e.d.HTTPAddr()
	do := func(method, path, token, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	score := `{"model":"m","token_ids":[1,2,3]}`
	for _, c := range []struct {
		method, path, token, body string
		code                      int
	}{
		{"GET", "/healthz", "", "", 200},
		{"GET", "/readyz", "", "", 200},
		{"GET", "/metrics", "", "", 200},
		{"POST", "/v1/score", "", score, 401},
		{"POST", "/v1/score", readToken, score, 200},
		{"POST", "/v1/endpoints", readToken, `{"address":"tcp://127.0.0.1:1"}`, 403},
		{"POST", "/v1/endpoints", adminToken, `{"address":"tcp://127.0.0.1:1"}`, 201},
		{"DELETE", "/v1/endpoints?address=tcp://127.0.0.1:1", adminToken, "", 204},
	} {
		if got := do(c.method, c.path, c.token, c.body); got != c.code {
			t.Errorf("%s %s token=%q: %d, want %d", c.method, c.path, c.token, got, c.code)
		}
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	if _, err := noCert.Get(base + "/healthz"); err == nil {
		t.Error("a client without a certificate was served")
	}

	conn, err := grpc.NewClient(e.d.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gc := kvindexv1.NewIndexerClient(conn)
	req := &kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2}}}}
	if _, err := gc.Score(context.Background(), req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC Score without a token: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+readToken)
	if _, err := gc.Score(ctx, req); err != nil {
		t.Errorf("gRPC Score with a read token: %v", err)
	}
}

// The security settings come from flags, env and both config file formats,
// and inconsistent ones are refused at start.
func TestSecurityConfig(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "c.yaml")
	js := filepath.Join(dir, "c.json")
	if err := os.WriteFile(yml, []byte("auth_token_file: /etc/kv/tokens\nadmin_api: true\nhttp_read_timeout: 7s\nallowed_endpoint_cidrs: [10.0.0.0/8]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(js, []byte(`{"tls_cert_file":"/c","tls_key_file":"/k","http_max_conns":9,"http_idle_timeout":"1m"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KVINDEX_HTTP_READ_HEADER_TIMEOUT": "2s"}
	cfg, err := loadConfig([]string{"--config", yml, "--metrics-auth"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AuthTokenFile != "/etc/kv/tokens" || !cfg.AdminAPI || !cfg.MetricsAuth || time.Duration(cfg.HTTPReadTimeout) != 7*time.Second ||
		time.Duration(cfg.HTTPReadHeaderTimeout) != 2*time.Second || len(cfg.AllowedEndpointCIDRs) != 1 || cfg.HTTPMaxConns != 10000 {
		t.Errorf("yaml: %+v", cfg.SecurityConfig)
	}
	cfg, err = loadConfig([]string{"--config", js}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLSCertFile != "/c" || cfg.HTTPMaxConns != 9 || time.Duration(cfg.HTTPIdleTimeout) != time.Minute {
		t.Errorf("json: %+v", cfg.SecurityConfig)
	}
	for _, args := range [][]string{
		{"--tls-cert-file", "/c"},
		{"--tls-client-ca-file", "/ca"},
		{"--metrics-auth"},
		{"--allowed-endpoint-cidrs", "10.0.0.0/33"},
		{"--http-read-timeout", "-1s"},
		{"--http-max-conns", "-1"},
		{"--endpoint", "tcp://10.0.0.7:5557", "--allowed-endpoint-cidrs", "192.168.0.0/16"},
		{"--endpoint", "tcp://192.168.0.7:5557,engine=sglang,snapshot=tcp://10.0.0.7:5559", "--allowed-endpoint-cidrs", "192.168.0.0/16"},
	} {
		args = append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--zmq-bind", "tcp://127.0.0.1:0"}, args...)
		cfg, err := loadConfig(args, func(string) string { return "" }, io.Discard)
		if err == nil {
			var d *daemon
			d, err = newDaemon(context.Background(), cfg, slog.New(slog.DiscardHandler))
			if d != nil {
				d.close()
			}
		}
		if err == nil {
			t.Errorf("%v: accepted", args)
		} else if strings.Contains(strings.Join(args, " "), "192.168") && !strings.Contains(err.Error(), "outside") {
			t.Errorf("%v: %v, want the address named outside the CIDRs", args, err)
		}
	}
}
