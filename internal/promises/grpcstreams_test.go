package promises

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// --grpc-max-streams (128 at the defaults): gRPC's own default is no limit,
// so one connection could open a call per stream whose request message
// never comes, each holding a goroutine for as long as the connection
// lives. The daemon advertises 128 concurrent streams in its SETTINGS; a
// client that opens 200 calls anyway gets the 72 past the cap refused
// (RST_STREAM REFUSED_STREAM, which a gRPC client retries), and another
// client is served meanwhile.
func TestPromiseGRPCMaxStreams(t *testing.T) {
	t.Parallel()
	const limit, opened = 128, 200
	d := harness.Start(t)
	c := rawDial(t, d.GRPC)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait.Limit))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	block := grpcCallHeaders()

	advertised, refused := uint32(0), 0
	sent := false
	for refused < opened-limit {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("after %v: advertised %d streams, %d of %d calls refused, want %d", wait.Limit, advertised, refused, opened, opened-limit)
			}
			t.Fatalf("reading the daemon's frames: %v (advertised %d, refused %d)", err, advertised, refused)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				advertised = v
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			if !sent {
				sent = true
				for i := 0; i < opened; i++ {
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true}); err != nil {
						t.Fatal(err)
					}
				}
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v, want REFUSED_STREAM", f.StreamID, f.ErrCode)
			}
			if f.StreamID < 2*limit+1 {
				t.Fatalf("stream %d (call %d, within the cap) refused", f.StreamID, f.StreamID/2+1)
			}
			refused++
		case *http2.GoAwayFrame:
			t.Fatalf("the daemon closed the connection (GOAWAY %v) instead of refusing the calls past the cap", f.ErrCode)
		}
	}
	if advertised != limit {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", advertised, limit)
	}
	// The connection's 128 calls wait for request messages that never
	// come; another client is served.
	if err := grpcHealthy(d.GRPC); err != nil {
		t.Fatalf("gRPC health beside a connection at its stream cap: %v", err)
	}
}

// grpcHealthy is one gRPC health check on a new client connection to
// addr, waiting for the connection up to wait.Limit.
func grpcHealthy(addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	return err
}
