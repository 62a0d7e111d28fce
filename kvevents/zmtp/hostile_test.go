package zmtp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// Hostile peers: each case sends bytes that crashed or stalled the pure-Go
// ZeroMQ library this package replaces (frames declaring 2^50 or 2^62
// bytes, READY metadata cut short) and the other malformations a
// parser must survive. Every case checks that the connection is dropped,
// the right counter moves, nothing panics, and a good publisher still gets
// through.

var hostileOpts = Options{MaxMessageSize: 1 << 20, MaxFrames: 4, HandshakeTimeout: 10 * time.Second}

func TestHostilePublishers(t *testing.T) {
	g31 := rawGreeting(1)
	ready := rawReady("PUB")
	oversized := func(s Stats) uint64 { return s.Oversized }
	protocol := func(s Stats) uint64 { return s.ProtocolErrors }
	cases := []struct {
		name    string
		send    []byte
		counter func(Stats) uint64
	}{
		{"command frame declaring 2^50 bytes before READY", cat(g31, longHeader(0x04, 1<<50)), oversized},
		{"command frame declaring 2^62 bytes before READY", cat(g31, longHeader(0x04, 1<<62)), oversized},
		{"command frame declaring 2^64-1 bytes before READY", cat(g31, longHeader(0x04, 1<<64-1)), oversized},
		{"message frame declaring 2^50 bytes before READY", cat(g31, longHeader(0, 1<<50)), protocol},
		{"READY metadata 1 byte short", cat(g31, rawCommand([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PU"))), protocol},
		{"READY property value declaring 2^32-1 bytes", cat(g31, rawCommand([]byte("\x05READY\x0bSocket-Type\xff\xff\xff\xffPUB"))), protocol},
		{"READY property name past the frame", cat(g31, rawCommand([]byte("\x05READY\xffSocket-Type"))), protocol},
		{"READY property with a missing value length", cat(g31, rawCommand([]byte("\x05READY\x0bSocket-Type\x00\x00"))), protocol},
		{"command name past the frame", cat(g31, rawCommand([]byte("\x20READY"))), protocol},
		{"empty command frame", cat(g31, []byte{0x04, 0x00}), protocol},
		{"READY without Socket-Type", cat(g31, rawCommand([]byte("\x05READY\x08Identity\x00\x00\x00\x00"))), protocol},
		{"peer is a SUB", cat(g31, rawReady("SUB")), protocol},
		{"peer is a ROUTER", cat(g31, rawReady("ROUTER")), protocol},
		{"HTTP request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), protocol},
		{"ZMTP 2 greeting", append(append([]byte{}, g31[:10]...), append([]byte{2, 0}, g31[12:]...)...), protocol},
		{"CURVE mechanism", append(append([]byte{}, g31[:12]...), append([]byte("CURVE\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), g31[32:]...)...), protocol},
		{"ERROR instead of READY", cat(g31, rawCommand([]byte("\x05ERROR\x04nope"))), func(s Stats) uint64 { return s.PeerErrors }},
		{"message frame declaring 2^50 bytes after the handshake", cat(g31, ready, longHeader(0, 1<<50)), oversized},
		{"message frame declaring 2^62 bytes after the handshake", cat(g31, ready, longHeader(0, 1<<62)), oversized},
		{"second frame pushing the message past MaxMessageSize", cat(g31, ready, []byte{0x01, 3}, []byte("kv@"), longHeader(0, 1<<20)), oversized},
		{"more frames than MaxFrames", cat(g31, ready, bytes.Repeat([]byte{0x01, 0x00}, 5)), oversized},
		{"command frame past the command cap after the handshake", cat(g31, ready, longHeader(0x04, 1<<20)), oversized},
		{"reserved flag bits", cat(g31, ready, []byte{0x80, 0x00}), protocol},
		{"command frame with MORE", cat(g31, ready, []byte{0x05, 0x05}, []byte("\x04PING")), protocol},
		{"PING with a 17-byte context", cat(g31, ready, rawCommand(append([]byte("\x04PING\x00\x0a"), bytes.Repeat([]byte{1}, 17)...))), protocol},
		{"PING without TTL", cat(g31, ready, rawCommand([]byte("\x04PING"))), protocol},
		{"second READY", cat(g31, ready, ready), protocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub, err := ListenSub("tcp://127.0.0.1:0", hostileOpts, "kv@")
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			c := dialRaw(t, sub.Addr())
			write(t, c, tc.send)
			expectClosed(t, c)
			wait.For(t, "the connection is counted and closed", func() bool {
				s := sub.Stats()
				return tc.counter(s) == 1 && s.Open == 0
			})
			s := sub.Stats()
			if s.Panics != 0 || s.Oversized+s.ProtocolErrors+s.PeerErrors+s.HandshakeTimeouts != 1 {
				t.Fatalf("stats %+v", s)
			}
			expectGoodPublisher(t, sub)
		})
	}
}

// A peer that sends its greeting a byte at a time never completes the
// handshake: the deadline covers the whole exchange, not each read.
func TestSlowLorisHandshakeIsCutOff(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{HandshakeTimeout: 300 * time.Millisecond}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		g := rawGreeting(1)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := c.Write(g[i%len(g) : i%len(g)+1]); err != nil {
				return
			}
		}
	}()
	expectClosed(t, c)
	wait.For(t, "a handshake timeout is counted", func() bool { return sub.Stats().HandshakeTimeouts == 1 })
	expectGoodPublisher(t, sub)
}

// Connections that never send a byte hold no one else up: a real libzmq
// publisher connecting after them is served while they are still open.
func TestIdleConnectionsDoNotBlockPublishers(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{HandshakeTimeout: 10 * time.Minute}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for range 3 {
		dialRaw(t, sub.Addr())
	}
	wait.For(t, "three idle connections accepted", func() bool { return sub.Stats().Accepted == 3 })
	p := startPeer(t, "pub-connect", "tcp://"+sub.Addr().String())
	p.line("sub")
	expectPublished(t, sub.Recv)
	if s := sub.Stats(); s.Open != 4 || s.HandshakeTimeouts != 0 || s.Handshakes != 1 {
		t.Fatalf("the idle connections should still be open and handshaking: %+v", s)
	}
}

func TestMaxConnsRejectsExtraConnections(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MaxConns: 2}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	idle := dialRaw(t, sub.Addr())
	dialRaw(t, sub.Addr())
	wait.For(t, "two connections accepted", func() bool { return sub.Stats().Accepted == 2 })
	expectClosed(t, dialRaw(t, sub.Addr()))
	wait.For(t, "the third is rejected", func() bool { return sub.Stats().Rejected == 1 })
	idle.Close()
	wait.For(t, "a slot frees up", func() bool { return sub.Stats().Open == 1 })
	expectGoodPublisher(t, sub)
}

// Messages waiting for Recv count against MaxBufferedBytes: a publisher
// outrunning a reader that does not read is dropped rather than growing
// memory.
func TestBufferBudgetDropsConnection(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MaxMessageSize: 1 << 20, MaxBufferedBytes: 1 << 20}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	big := payload(1, 600<<10)
	write(t, c, cat(rawMessage([]byte("kv@a"), seq8(1), big), rawMessage([]byte("kv@a"), seq8(2), big)))
	expectClosed(t, c)
	wait.For(t, "budget drop counted", func() bool { return sub.Stats().BudgetExceeded == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := sub.Recv(ctx)
	if err != nil || !bytes.Equal(m.Frames[2], big) {
		t.Fatalf("the first message should be intact: %v", err)
	}
	if used := sub.sock.budget.used.Load(); used != 0 {
		t.Fatalf("%d bytes still reserved after the message was handed over", used)
	}
	expectGoodPublisher(t, sub)
}

// A frame that declares far more than it sends costs only what arrives.
func TestDeclaredSizeIsNotAllocatedUpFront(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	write(t, c, cat(longHeader(0, 60<<20), []byte("0123456789")))
	wait.For(t, "the frame is being read", func() bool { return sub.sock.budget.used.Load() > 0 })
	time.Sleep(50 * time.Millisecond)
	if used := sub.sock.budget.used.Load(); used > firstChunk {
		t.Fatalf("%d bytes reserved for 10 received", used)
	}
}

func TestReadBodyGrowsWithArrivingBytes(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := readBody(bytes.NewReader([]byte("0123456789")), 60<<20, nil, 0)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("allocated %d bytes for a truncated 60 MiB frame", d)
	}
}

// A dialled socket meets a hostile "engine": the dial or the first Recv
// fails with the reason, counted, and nothing panics.
func TestHostileEngineOnDial(t *testing.T) {
	g31 := rawGreeting(1)
	cases := []struct {
		name    string
		dealer  bool
		send    []byte
		dialErr error // nil: the dial succeeds and Recv fails with recvErr
		recvErr error
	}{
		{name: "command frame declaring 2^50 bytes", send: cat(g31, longHeader(0x04, 1<<50)), dialErr: ErrTooLarge},
		{name: "READY metadata 1 byte short", send: cat(g31, rawCommand([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PU"))), dialErr: ErrProtocol},
		{name: "message frame declaring 2^50 bytes after READY", send: cat(g31, rawReady("PUB"), longHeader(0, 1<<50)), recvErr: ErrTooLarge},
		{name: "message frame declaring 2^62 bytes after READY", send: cat(g31, rawReady("PUB"), longHeader(0, 1<<62)), recvErr: ErrTooLarge},
		{name: "silent engine", send: nil, dialErr: ErrHandshakeTimeout},
		{name: "half a greeting", send: g31[:30], dialErr: ErrHandshakeTimeout},
		{name: "dealer: ROUTER then 2^62 bytes", dealer: true, send: cat(g31, rawReady("ROUTER"), longHeader(0, 1<<62)), recvErr: ErrTooLarge},
		{name: "dealer: peer is a PUB", dealer: true, send: cat(g31, rawReady("PUB")), dialErr: ErrProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
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
				_, _ = c.Write(tc.send)
				_, _ = c.Read(make([]byte, 64))
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				for {
					if _, err := c.Read(make([]byte, 512)); err != nil {
						return
					}
				}
			}()
			ctr := &Counters{}
			opts := Options{HandshakeTimeout: 300 * time.Millisecond, Counters: ctr}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ep := "tcp://" + ln.Addr().String()
			var recv func(context.Context) (Message, error)
			var closer func() error
			if tc.dealer {
				var d *Dealer
				d, err = DialDealer(ctx, ep, opts)
				if d != nil {
					recv, closer = d.Recv, d.Close
				}
			} else {
				var s *Sub
				s, err = DialSub(ctx, ep, opts, "kv@")
				if s != nil {
					recv, closer = s.Recv, s.Close
				}
			}
			if tc.dialErr != nil {
				if !errors.Is(err, tc.dialErr) {
					t.Fatalf("dial: %v, want %v", err, tc.dialErr)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer closer()
				if _, err := recv(ctx); !errors.Is(err, tc.recvErr) {
					t.Fatalf("recv: %v, want %v", err, tc.recvErr)
				}
			}
			s := ctr.Read()
			if s.Panics != 0 || s.Open != 0 || s.Oversized+s.ProtocolErrors+s.HandshakeTimeouts != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}
