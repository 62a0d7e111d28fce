package client

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// countingListener counts accepted connections (connection reuse).
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// server is the API in-process, as a daemon serves it: memory index fed through the
// indexer's sink, served by the api package over gRPC on loopback.
type server struct {
	idx  *indexer.Indexer
	ln   *countingListener
	stop func()
}

func startServer(t *testing.T, unary grpc.UnaryServerInterceptor) *server {
	t.Helper()
	return startServerOn(t, "127.0.0.1:0", unary)
}

// startServerOn serves on addr: host:port or unix:///path (api.Listen).
func startServerOn(t *testing.T, addr string, unary grpc.UnaryServerInterceptor) *server {
	t.Helper()
	reg := prometheus.NewRegistry()
	idx, err := indexer.New(context.Background(), indexer.Config{
		Keys: blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Indexer: idx, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := api.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	var opts []grpc.ServerOption
	if unary != nil {
		opts = append(opts, grpc.UnaryInterceptor(unary))
	}
	gs := srv.NewGRPCServer(opts...)
	go func() { _ = gs.Serve(ln) }()
	d := &server{idx: idx, ln: ln, stop: gs.Stop}
	t.Cleanup(gs.Stop)
	return d
}

func (d *server) store(pod string, hashes []uint64) {
	d.idx.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: "m",
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, BlockSize: 4}}})
}

func newClient(t *testing.T, addr string, timeout time.Duration) *Client {
	t.Helper()
	c, err := New(Config{Addr: addr, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestPickThroughDaemon(t *testing.T) {
	d := startServer(t, nil)
	d.store("warm", []uint64{1, 2, 3})
	c := newClient(t, d.ln.Addr().String(), time.Second)
	req := &Request{Model: "m", BlockHashes: []uint64{1, 2, 3, 4},
		Candidates: []Candidate{{Pod: "cold", Running: 1}, {Pod: "warm", Running: 1}}}
	for i := 0; i < 5; i++ {
		dec, err := c.Pick(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Fallback || dec.Pod != "warm" || dec.Index != 1 || dec.Policy != "sglang" || dec.Candidates[1].MatchedBlocks < 3 {
			t.Fatalf("decision %+v", dec)
		}
	}
	// Five calls, one connection.
	if n := d.ln.n.Load(); n != 1 {
		t.Errorf("%d connections for 5 calls, want 1", n)
	}
}

// TestPickOverUnixSocket: the daemon's unix:///path address is a target
// the client dials as it is (a sidecar next to the router).
func TestPickOverUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvc") // short: socket paths are limited to ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	addr := api.UnixPrefix + filepath.Join(dir, "k.sock")
	d := startServerOn(t, addr, nil)
	d.store("warm", []uint64{1, 2})
	c := newClient(t, addr, time.Second)
	dec, err := c.Pick(context.Background(), &Request{Model: "m", BlockHashes: []uint64{1, 2},
		Candidates: []Candidate{{Pod: "cold"}, {Pod: "warm"}}})
	if err != nil {
		t.Fatal(err)
	}
	if dec.Fallback || dec.Pod != "warm" || dec.Candidates[1].MatchedBlocks != 2 {
		t.Fatalf("decision %+v (err %v)", dec, dec.Err)
	}
	if d.ln.Addr().Network() != "unix" {
		t.Fatalf("served on %s", d.ln.Addr().Network())
	}
}

func TestMalformedRequestIsAnError(t *testing.T) {
	d := startServer(t, nil)
	c := newClient(t, d.ln.Addr().String(), time.Second)
	_, err := c.Pick(context.Background(), &Request{Model: "m", BlockHashes: []uint64{1}, Candidates: []Candidate{{Pod: ""}}})
	if status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
	if _, err := c.Pick(context.Background(), &Request{Model: "m"}); err == nil {
		t.Fatal("no candidates accepted")
	}
}

// Request.AddSpecialTokens reaches the daemon: it is sent when set (and
// refused beside block hashes, as the daemon refuses it with any input but
// a prompt or messages), and left unset otherwise.
func TestAddSpecialTokensSent(t *testing.T) {
	var sent atomic.Pointer[kvindexv1.PickRequest]
	d := startServer(t, func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := req.(*kvindexv1.PickRequest); ok {
			sent.Store(p)
		}
		return h(ctx, req)
	})
	c := newClient(t, d.ln.Addr().String(), time.Second)
	off := false
	_, err := c.Pick(context.Background(), &Request{Model: "m", Prompt: "hello", AddSpecialTokens: &off,
		Candidates: []Candidate{{Pod: "a"}}})
	if p := sent.Load(); p == nil || p.AddSpecialTokens == nil || *p.AddSpecialTokens || p.GetPrompt() != "hello" {
		t.Fatalf("sent %v (answer %v)", p, err)
	}
	_, err = c.Pick(context.Background(), &Request{Model: "m", BlockHashes: []uint64{1}, AddSpecialTokens: &off,
		Candidates: []Candidate{{Pod: "a"}}})
	if status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("add_special_tokens beside block hashes: %v", err)
	}
	if _, err := c.Pick(context.Background(), &Request{Model: "m", BlockHashes: []uint64{1}, Candidates: []Candidate{{Pod: "a"}}}); err != nil {
		t.Fatal(err)
	}
	if p := sent.Load(); p.AddSpecialTokens != nil {
		t.Fatalf("unset AddSpecialTokens sent as %v", *p.AddSpecialTokens)
	}
}

// A daemon that is gone, or too slow for the deadline, yields the least
// loaded candidate.
func TestFallbackWhenUnreachable(t *testing.T) {
	d := startServer(t, nil)
	addr := d.ln.Addr().String()
	d.stop()
	c := newClient(t, addr, 200*time.Millisecond)
	req := &Request{Model: "m", BlockHashes: []uint64{1},
		Candidates: []Candidate{{Pod: "a", Running: 3}, {Pod: "b", Running: 1, Waiting: 1, KVUsage: 0.5}, {Pod: "c", Running: 2, KVUsage: 0.1}}}
	dec, err := c.Pick(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !dec.Fallback || dec.Err == nil || dec.Pod != "c" || dec.Index != 2 || dec.Policy != "least-loaded" {
		t.Fatalf("decision %+v", dec)
	}
}

func TestFallbackOnDeadline(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	// The daemon never answers in time: past the deadline it gives up, as
	// a busy daemon would. (Answering after it raced the client's own
	// deadline on a loaded machine: the late answer sometimes won.)
	slow := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		select {
		case <-release:
			return h(ctx, req)
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	d := startServer(t, slow)
	c := newClient(t, d.ln.Addr().String(), 30*time.Millisecond)
	dec, err := c.Pick(context.Background(), &Request{Model: "m", BlockHashes: []uint64{1}, Candidates: []Candidate{{Pod: "a", Running: 2}, {Pod: "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !dec.Fallback || dec.Pod != "b" || status.Code(dec.Err) != codes.DeadlineExceeded {
		t.Fatalf("decision %+v", dec)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("empty address accepted")
	}
	if _, err := New(Config{Addr: "x:1", Timeout: -1}); err == nil {
		t.Error("negative timeout accepted")
	}
}

// Token ids travel packed (little-endian uint32) and score as the daemon's
// own hashing of them.
func TestPickTokenIDs(t *testing.T) {
	d := startServer(t, nil)
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []uint32{151_000, 2, 3, 4, 5, 6, 7, 1 << 20, 9}
	var hashes []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	d.store("warm", hashes)
	c := newClient(t, d.ln.Addr().String(), time.Second)
	dec, err := c.Pick(context.Background(), &Request{Model: "m", TokenIDs: tokens,
		Candidates: []Candidate{{Pod: "cold"}, {Pod: "warm", Running: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if dec.Fallback || dec.Pod != "warm" || dec.Candidates[1].MatchedBlocks != 2 {
		t.Fatalf("decision %+v (err %v)", dec, dec.Err)
	}
}

// TestPickPD: candidate roles reach the daemon, and its P/D answer comes
// back whole: the decode pod, the prefill pod holding the prefix, the
// decision with its numbers, and a kv_source holding more than both.
func TestPickPD(t *testing.T) {
	d := startServer(t, nil)
	// 300 blocks of 4 tokens (1200 tokens, above the 1000-token default):
	// pf-b holds 100, pod-x (not offered) 250, the decode pods nothing.
	hashes := make([]uint64, 300)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	d.store("pf-b", hashes[:100])
	d.store("pod-x", hashes[:250])
	c := newClient(t, d.ln.Addr().String(), time.Second)
	req := &Request{Model: "m", BlockHashes: hashes, Candidates: []Candidate{{Pod: "pf-a", Role: "prefill"},
		{Pod: "pf-b", Role: "prefill"}, {Pod: "dc-a", Role: "decode", KVUsage: 0.1}, {Pod: "dc-b", Role: "decode", KVUsage: 0.2}}}
	dec, err := c.Pick(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Pod != "dc-a" || dec.Index != 2 || dec.Disaggregation == nil || dec.Disaggregation.Decision != "disaggregated" ||
		dec.Disaggregation.NonCachedTokens != 1200 || dec.Disaggregation.MaxLocalPrefillTokens != 1000 {
		t.Fatalf("decision %+v %+v", dec, dec.Disaggregation)
	}
	if p := dec.PrefillPod; p == nil || p.Pod != "pf-b" || p.Index != 1 || p.MatchedBlocks != 100 || p.Reason != "best-prefix" {
		t.Fatalf("prefill pod %+v", p)
	}
	if k := dec.KVSource; k == nil || k.Pod != "pod-x" || k.Index != -1 || k.Blocks != 250 || k.ExtraBlocks != 150 {
		t.Fatalf("kv source %+v", k)
	}
	if dec.Candidates[0].Role != "prefill" || dec.Candidates[2].Role != "decode" {
		t.Fatalf("candidate roles %+v", dec.Candidates)
	}
	// A role the daemon does not know is an error, not a fallback.
	req.Candidates[0].Role = "prefiller"
	if _, err := c.Pick(context.Background(), req); status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("unknown role: %v", err)
	}
}

// TestFallbackPD: without the daemon, a P/D request goes to the least
// loaded pod that decodes, never to a prefill-only pod.
func TestFallbackPD(t *testing.T) {
	r := &Request{Candidates: []Candidate{{Pod: "pf", Role: "prefill"}, {Pod: "dc-busy", Role: "decode", Running: 3},
		{Pod: "dc", Role: "decode", Running: 1}, {Pod: "enc", Role: "encode"}}}
	if d := Fallback(r, errors.New("down")); d.Pod != "dc" || d.Index != 2 || d.PrefillPod != nil {
		t.Fatalf("fallback %+v", d)
	}
	// Nobody decodes: the least loaded of all (the daemon would refuse it).
	r = &Request{Candidates: []Candidate{{Pod: "pf-a", Role: "prefill", Running: 2}, {Pod: "pf-b", Role: "prefill"}}}
	if d := Fallback(r, errors.New("down")); d.Pod != "pf-b" {
		t.Fatalf("fallback %+v", d)
	}
}
