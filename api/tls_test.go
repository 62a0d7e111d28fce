package api

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/testcerts"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// HTTP and gRPC over TLS with client certificates: a client without one,
// or with one from another CA, fails the handshake; a rotated server
// certificate is served without a restart.
func TestTLSMutualAndReload(t *testing.T) {
	dir := t.TempDir()
	ca, other := testcerts.NewCA(t, "ca"), testcerts.NewCA(t, "other")
	var files TLSFiles
	files.CertFile, files.KeyFile, files.ClientCAFile = ca.WriteServerFiles(t, dir, 100)
	reg := prometheus.NewRegistry()
	rl, err := NewTLSReloader("http", files, reg, nil)
	if err != nil {
		t.Fatal(err)
	}

	g := newGuarded(t, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: g.srv.Handler(), TLSConfig: rl.ServerConfig("h2", "http/1.1")}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := g.srv.NewGRPCServer(grpc.Creds(credentials.NewTLS(rl.ServerConfig("h2"))))
	go func() { _ = gs.Serve(gln) }()
	t.Cleanup(gs.Stop)

	roots := ca.Pool()
	clientCert := func(from *testcerts.CA) []tls.Certificate {
		if from == nil {
			return nil
		}
		return []tls.Certificate{from.ClientCert(t)}
	}
	get := func(from *testcerts.CA) (*http.Response, error) {
		cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: clientCert(from)}}}
		defer cl.CloseIdleConnections()
		return cl.Get("https://" + ln.Addr().String() + "/healthz")
	}
	if _, err := get(nil); err == nil {
		t.Error("HTTPS without a client certificate succeeded")
	}
	if _, err := get(other); err == nil {
		t.Error("HTTPS with a client certificate of another CA succeeded")
	}
	resp, err := get(ca)
	if err != nil {
		t.Fatalf("HTTPS with a client certificate: %v", err)
	}
	resp.Body.Close()
	if got := resp.TLS.PeerCertificates[0].SerialNumber.Int64(); got != 100 {
		t.Fatalf("served serial %d, want 100", got)
	}

	grpcCheck := func(from *testcerts.CA) error {
		conn, err := grpc.NewClient(gln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: roots, Certificates: clientCert(from)})))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := grpcCheck(nil); err == nil {
		t.Error("gRPC over TLS without a client certificate succeeded")
	}
	if err := grpcCheck(ca); err != nil {
		t.Errorf("gRPC over TLS with a client certificate: %v", err)
	}

	// Rotate the server certificate in place; the next handshake after
	// the check interval serves it.
	c, k := ca.Issue(t, 200, false)
	writeFile(t, files.CertFile, c)
	writeFile(t, files.KeyFile, k)
	rl.mu.Lock()
	rl.lastCheck = time.Time{}
	rl.mu.Unlock()
	resp, err = get(ca)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.TLS.PeerCertificates[0].SerialNumber.Int64(); got != 200 {
		t.Errorf("after rotation: serial %d, want 200", got)
	}
	// A half-written rotation keeps serving the last good certificate.
	writeFile(t, files.KeyFile, []byte("not a key"))
	rl.mu.Lock()
	rl.lastCheck = time.Time{}
	rl.mu.Unlock()
	if resp, err = get(ca); err != nil {
		t.Fatalf("after a broken rotation: %v", err)
	}
	resp.Body.Close()
	if got := resp.TLS.PeerCertificates[0].SerialNumber.Int64(); got != 200 {
		t.Errorf("after a broken rotation: serial %d, want 200", got)
	}

	if _, err := NewTLSReloader("x", TLSFiles{CertFile: files.CertFile}, nil, nil); err == nil {
		t.Error("TLS without a key file accepted")
	}
	if _, err := NewTLSReloader("x", files, nil, nil); err == nil {
		t.Error("a broken key file loaded at start")
	}
}
