package api

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/internal/testkit/testcerts"
)

// scriptConn returns its chunks one Read at a time, then EOF.
type scriptConn struct {
	net.Conn
	chunks [][]byte
	closed bool
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

func (c *scriptConn) Close() error { c.closed = true; return nil }

func frame(typ, flags byte, payload int) []byte {
	b := make([]byte, 9+payload)
	b[0], b[1], b[2] = byte(payload>>16), byte(payload>>8), byte(payload)
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], 1)
	return b
}

// The connection counts a header block's bytes (frame headers included)
// while it is read, and gives them back at the first read after its last
// frame, whatever the read sizes; other frames are not counted.
func TestGRPCHeaderConnCountsBlocks(t *testing.T) {
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(0x4, 0, 0)...)
	block := append(frame(0x1, 0, 16384), frame(0x9, 0x4, 4000)...) // HEADERS + CONTINUATION(END_HEADERS)
	data := frame(0x0, 0, 30000)
	small := frame(0x1, 0x4, 200)
	var stream []byte
	for _, p := range [][]byte{preface, block, data, small} {
		stream = append(stream, p...)
	}
	for _, chunk := range []int{1, 7, 9, 4096, len(stream)} {
		b := &headerBudget{limit: 1 << 20, rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}
		var chunks [][]byte
		for rest := stream; len(rest) > 0; {
			n := min(chunk, len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		c := &headerConn{Conn: &scriptConn{chunks: chunks}, budget: b, preface: http2PrefaceLen}
		read, peak := 0, int64(0)
		buf := make([]byte, chunk)
		for {
			n, err := c.Read(buf)
			read += n
			peak = max(peak, b.used.Load())
			// bytes of the big block in hand: counted, unless a later read
			// gave them back
			if read >= len(preface)+len(block) && read < len(stream)-len(small) && read-n >= len(preface)+len(block) {
				if u := b.used.Load(); u != 0 {
					t.Fatalf("chunk %d: %d bytes read, past the first block: %d held, want 0", chunk, read, u)
				}
			}
			if err != nil {
				break
			}
		}
		want := len(block)
		if chunk == len(stream) {
			want += len(small) // one read holds both blocks until the next
		}
		if peak != int64(want) {
			t.Errorf("chunk %d: peak %d held, want the blocks' %d bytes", chunk, peak, want)
		}
		if u := b.used.Load(); u != 0 {
			t.Errorf("chunk %d: %d held after the last read, want 0", chunk, u)
		}
	}

	// a block beyond the budget closes the connection before it is decoded
	b := &headerBudget{limit: 8 << 10, rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}
	sc := &scriptConn{chunks: [][]byte{preface, block}}
	c := &headerConn{Conn: sc, budget: b, preface: http2PrefaceLen}
	buf := make([]byte, 64<<10)
	var err error
	for err == nil {
		_, err = c.Read(buf)
	}
	if !errors.Is(err, errHeaderBudget) || !sc.closed || b.used.Load() != 0 {
		t.Fatalf("over budget: err %v, closed %v, %d held; want errHeaderBudget, closed, 0", err, sc.closed, b.used.Load())
	}
}

// Calls count their decoded headers until their stream ends: with a 100 KiB
// budget, Watch streams with 10 KiB of metadata are refused (Unavailable,
// naming the flag) once three quarters of it is held, are admitted again
// when one ends, and every byte is given back when all end; plaintext and
// TLS alike.
func TestGRPCHeaderBudgetRefusesCalls(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	dir := t.TempDir()
	var files TLSFiles
	files.CertFile, files.KeyFile, files.ClientCAFile = ca.WriteServerFiles(t, dir, 100)
	rl, err := NewTLSReloader("grpc", files, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		server, client credentials.TransportCredentials
	}{
		{"plaintext", nil, insecure.NewCredentials()},
		{"tls", credentials.NewTLS(rl.ServerConfig("h2")), credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.ClientCert(t)}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t, Config{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := g.srv.NewGRPCServer(g.srv.GRPCHeaderBudget(HTTPLimits{HeaderBudget: 100 << 10}, tc.server)...)
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(gs.Stop)
			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(tc.client))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			hc := healthpb.NewHealthClient(cc)
			md := metadata.Pairs("x-pad", strings.Repeat("a", 10<<10))
			var cancels []context.CancelFunc
			defer func() {
				for _, c := range cancels {
					c()
				}
			}()
			open := func() error {
				ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
				w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err == nil {
					_, err = w.Recv()
				}
				if err != nil {
					cancel()
					return err
				}
				cancels = append(cancels, cancel)
				return nil
			}
			for len(cancels) < 20 {
				if err := open(); err != nil {
					if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--http-header-budget-bytes") {
						t.Fatalf("stream %d: %v, want Unavailable naming the flag", len(cancels)+1, err)
					}
					break
				}
			}
			t.Logf("%d streams held", len(cancels))
			if n := len(cancels); n < 3 || n > 7 {
				t.Fatalf("%d streams of 10 KiB headers held in a 100 KiB budget, want 3 to 7 (three quarters)", n)
			}
			// a small call still fits
			if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("small call with the budget held: %v", err)
			}
			cancels[0]()
			cancels = cancels[1:]
			deadline := time.Now().Add(5 * time.Second)
			for open() != nil {
				if time.Now().After(deadline) {
					t.Fatal("a stream's end gave no room back")
				}
				time.Sleep(10 * time.Millisecond)
			}
			for _, c := range cancels {
				c()
			}
			cancels = nil
			for g.srv.hdrBudget.used.Load() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d bytes held after every stream ended, want 0", g.srv.hdrBudget.used.Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
