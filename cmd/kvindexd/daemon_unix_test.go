package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/api"
)

// TestDaemonServesUnixSockets runs the daemon with both listeners on unix
// sockets: each file is created with the documented mode, answers its
// protocol, and is removed when the daemon stops.
func TestDaemonServesUnixSockets(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvd") // short: socket paths are limited to ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	grpcPath, httpPath := filepath.Join(dir, "g.sock"), filepath.Join(dir, "h.sock")
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.ZMQBind = api.UnixPrefix+grpcPath, api.UnixPrefix+httpPath, "tcp://127.0.0.1:0"
	cfg.HashAlgo, cfg.HashSeed, cfg.BlockSize = "sha256", e2eSeed, e2eBlock
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := newDaemon(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	for _, p := range []string{grpcPath, httpPath} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != api.UnixSocketMode {
			t.Fatalf("%s: %v, %v", p, fi, err)
		}
	}
	conn, err := grpc.NewClient(cfg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health over the unix socket: %v, %v", hr, err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", httpPath)
	}}}
	resp, err := hc.Get("http://kvindex/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP /healthz over the unix socket: %d %s", resp.StatusCode, body)
	}
	hc.CloseIdleConnections()

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{grpcPath, httpPath} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after stop: %v", p, err)
		}
	}
}
