package zmtp

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// ZMTP 3.1 peers get SUBSCRIBE commands; 3.0 peers (libzmq 4.1 and older)
// get subscription messages: 1, then the prefix (RFC 37 and RFC 23).
func TestSubscriptionFollowsNegotiatedVersion(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@", "")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, tc := range []struct {
		minor byte
		flags byte
		first string
	}{{1, 0x04, "\x09SUBSCRIBEkv@"}, {0, 0x00, "\x01kv@"}} {
		c := dialRaw(t, sub.Addr())
		flags, first := handshakeAsPub(t, c, tc.minor)
		if flags != tc.flags || string(first) != tc.first {
			t.Fatalf("ZMTP 3.%d: first subscription flags %#x %q, want %#x %q", tc.minor, flags, first, tc.flags, tc.first)
		}
		flags, second, err := readRawFrame(c)
		if err != nil || flags != tc.flags || string(second) != tc.first[:len(tc.first)-3] {
			t.Fatalf("ZMTP 3.%d: second subscription flags %#x %q %v", tc.minor, flags, second, err)
		}
	}
}

// The subscriber filters too: a publisher that ignores subscriptions does
// not get other topics through.
func TestTopicsFilteredOnReceipt(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	write(t, c, cat(rawMessage([]byte("other@x"), []byte("1")), rawMessage([]byte("kv"), []byte("2")),
		rawMessage([]byte("kv@x"), []byte("3"))))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := sub.Recv(ctx)
	if err != nil || string(m.Frames[1]) != "3" {
		t.Fatalf("got %q, %v", m.Frames, err)
	}
	if s := sub.Stats(); s.Filtered != 2 || s.Messages != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPingAnsweredWithPong(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	write(t, c, rawCommand([]byte("\x04PING\x00\x0actx-16-bytes-max")))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	flags, body, err := readRawFrame(c)
	if err != nil || flags != 0x04 || string(body) != "\x04PONGctx-16-bytes-max" {
		t.Fatalf("flags %#x %q %v", flags, body, err)
	}
}

// With heartbeats on, a peer that answers nothing is dropped; one that
// answers (libzmq does, below) stays.
func TestHeartbeatDropsSilentPeer(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0",
		Options{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	flags, body, err := readRawFrame(c)
	if err != nil || flags != 0x04 || string(body) != "\x04PING\x00\x03" {
		t.Fatalf("expected a PING with a TTL of 3 ds: flags %#x %q %v", flags, body, err)
	}
	expectClosed(t, c)
	wait.For(t, "a heartbeat timeout is counted", func() bool { return sub.Stats().HeartbeatTimeouts == 1 })
}

func TestHeartbeatKeepsLibzmqPeer(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0",
		Options{HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 2 * time.Second}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p := startPeer(t, "pub-connect", "tcp://"+sub.Addr().String())
	p.line("sub")
	expectPublished(t, sub.Recv)
	p.line("sent")
	time.Sleep(2500 * time.Millisecond) // over a heartbeat timeout of publisher silence
	if s := sub.Stats(); s.HeartbeatTimeouts != 0 || s.Open != 1 {
		t.Fatalf("libzmq answers PING with PONG, so the connection should stay: %+v", s)
	}
}

func TestInteropIPC(t *testing.T) {
	ep := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	sub, err := ListenSub(ep, Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p := startPeer(t, "pub-connect", ep)
	p.line("sub")
	expectPublished(t, sub.Recv)
}

// A dialled Sub hands over what arrived before the publisher left, then
// says why the connection ended.
func TestDialledSubReportsEnd(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write(cat(rawGreeting(1), rawReady("XPUB"), rawMessage([]byte("kv@a"), []byte("last"))))
		_ = c.(*net.TCPConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.Copy(io.Discard, c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := DialSub(ctx, "tcp://"+ln.Addr().String(), Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if sub.Addr() != nil {
		t.Fatalf("a dialled Sub has no bound address: %v", sub.Addr())
	}
	wait.For(t, "the connection ends", func() bool { return sub.Stats().Open == 0 })
	m, err := sub.Recv(ctx)
	if err != nil || string(m.Frames[1]) != "last" {
		t.Fatalf("queued message: %q %v", m.Frames, err)
	}
	if _, err := sub.Recv(ctx); err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("want the connection's end, got %v", err)
	}
}

func TestCloseEndsRecvAndPendingHandshakes(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{HandshakeTimeout: time.Hour}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, sub.Addr())
	wait.For(t, "accepted", func() bool { return sub.Stats().Open == 1 })
	errc := make(chan error, 1)
	go func() {
		_, err := sub.Recv(context.Background())
		errc <- err
	}()
	sub.Close() // returns only once the handshaking goroutine has ended
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
	expectClosed(t, c)
	if s := sub.Stats(); s.Open != 0 || s.HandshakeTimeouts != 0 || s.ProtocolErrors != 0 {
		t.Fatalf("closing is not a connection failure: %+v", s)
	}
}

func TestDealerSendHonoursContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hold := make(chan struct{})
	defer close(hold)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write(cat(rawGreeting(1), rawReady("ROUTER")))
		<-hold // and never read: our sends fill the socket buffers
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := DialDealer(ctx, "tcp://"+ln.Addr().String(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	big := make([]byte, 64<<20)
	if err := d.Send(sctx, big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send into a peer that never reads: %v", err)
	}
	if err := d.Send(ctx, []byte("x")); err == nil {
		t.Fatal("a half-written message ends the connection")
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, network, addr string }{
		{"tcp://*:5557", "tcp", ":5557"},
		{"tcp://127.0.0.1:0", "tcp", "127.0.0.1:0"},
		{"tcp://[::1]:5557", "tcp", "[::1]:5557"},
		{"ipc:///tmp/kv.sock", "unix", "/tmp/kv.sock"},
	} {
		n, a, err := parseEndpoint(tc.in)
		if err != nil || n != tc.network || a != tc.addr {
			t.Errorf("%s: %s %s %v", tc.in, n, a, err)
		}
	}
	for _, bad := range []string{"", "tcp://nohost", "udp://1.2.3.4:5", "inproc://x", "ipc://", "foo://bar:1"} {
		if _, _, err := parseEndpoint(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A caller's context deadline shorter than HandshakeTimeout is a handshake
// timeout too, and counted as one.
func TestDialContextDeadlineIsHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.Copy(io.Discard, c) // silent until we hang up
	}()
	ctr := &Counters{}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = DialDealer(ctx, "tcp://"+ln.Addr().String(), Options{HandshakeTimeout: time.Hour, Counters: ctr})
	if !errors.Is(err, ErrHandshakeTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v", err)
	}
	if s := ctr.Read(); s.HandshakeTimeouts != 1 || s.Open != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// The last-resort recover turns a panic into a counted connection error, so
// the hostile tests' "Panics == 0" checks would see a parser that panics.
func TestGuardCountsPanics(t *testing.T) {
	s := newSocket("SUB", Options{}, nil)
	err := s.guard(func() error {
		var b []byte
		_ = b[5] // index out of range, as a missing bounds check would
		return nil
	})
	if !errors.Is(err, errPanic) {
		t.Fatalf("guard: %v", err)
	}
	s.counters.count(err)
	if p := s.counters.Read().Panics; p != 1 {
		t.Fatalf("panics %d", p)
	}
}
