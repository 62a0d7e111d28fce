package promises

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// lockoutBound is the stated bound (docs/security.md): while a hostile peer
// holds every connection slot idle and re-dials whatever is closed, a new
// client's first call answers within it.
const lockoutBound = 2 * time.Second

// hostileIdlers keeps n connections to addr open, each sending hello (may
// be empty) and then nothing, re-dialling each one the daemon closes, until
// stop is closed. It returns how many dials it made.
func hostileIdlers(addr string, n int, hello string, stop <-chan struct{}) (wait func() int64) {
	var dials atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				dials.Add(1)
				if hello != "" {
					_, _ = io.WriteString(c, hello)
				}
				done := make(chan struct{})
				go func() { _, _ = io.Copy(io.Discard, c); close(done) }()
				select {
				case <-done:
				case <-stop:
				}
				c.Close()
			}
		})
	}
	return func() int64 { wg.Wait(); return dials.Load() }
}

// --grpc-max-conns with a hostile peer at the cap: 200 connections that
// finish the HTTP/2 preface and idle, re-dialled as soon as they are
// closed, cannot lock a real client out. At the cap the daemon evicts an
// idle connection that never made a call, so every new client's first
// Score and every call of a client already connected answer within
// lockoutBound. Before, a new client waited in the kernel backlog until the
// idle timeout (2 min) closed a connection, and the attacker re-dialled it
// first.
func TestPromiseGRPCIdleLockout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--grpc-max-conns", "200")
	stop := make(chan struct{})
	preface := "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"
	waitIdlers := hostileIdlers(d.GRPC, 200, preface, stop)
	defer func() {
		close(stop)
		t.Logf("hostile dials: %d", waitIdlers())
	}()
	// The attacker holds the cap before the clients arrive.
	deadline := time.Now().Add(20 * time.Second)
	// (One or two of its connections are between a close and a re-dial
	// at any time.)
	for d.Metric(`kvindexd_open_connections{server="grpc"}`) < 195 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := d.Metric(`kvindexd_open_connections{server="grpc"}`); n < 195 {
		t.Fatalf("the hostile peer holds %v connections, want about the cap 200", n)
	}
	score := func(c kvindexv1.IndexerClient) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), lockoutBound)
		defer cancel()
		start := time.Now()
		_, err := c.Score(ctx, &kvindexv1.ScoreRequest{Model: "org/model",
			Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}}},
			grpc.WaitForReady(true))
		return time.Since(start), err
	}
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(d.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	steady := dial()
	defer steady.Close()
	steadyClient := kvindexv1.NewIndexerClient(steady)
	var worst time.Duration
	for i := range 10 {
		// A client that connects now.
		conn := dial()
		el, err := score(kvindexv1.NewIndexerClient(conn))
		conn.Close()
		if err != nil {
			t.Fatalf("new client %d: Score failed after %v with the cap held by idle peers: %v", i, el, err)
		}
		worst = max(worst, el)
		// A client that stays connected between calls.
		if el, err = score(steadyClient); err != nil {
			t.Fatalf("connected client, call %d: Score failed after %v: %v", i, el, err)
		}
		worst = max(worst, el)
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("slowest Score during the attack: %v", worst)
	if v := d.Metric(`kvindexd_connections_evicted_total{server="grpc"}`); v < 10 {
		t.Errorf(`kvindexd_connections_evicted_total{server="grpc"} = %v, want >= 10`, v)
	}
}
