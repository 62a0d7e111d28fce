package zmtp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// Fuzz targets for everything that parses peer bytes. `go test` runs the
// seeds in testdata/fuzz (made by hack/zmtp_fuzz_seeds.py); `go test
// -fuzz=FuzzStream ./zmtp` explores further.

func FuzzGreeting(f *testing.F) {
	f.Add(rawGreeting(1))
	f.Add(rawGreeting(0))
	f.Fuzz(func(t *testing.T, b []byte) {
		minor, err := parseGreeting(b)
		if err == nil && (len(b) != greetingLen || minor > 1) {
			t.Fatalf("accepted %d bytes, minor %d", len(b), minor)
		}
		if err != nil && !errors.Is(err, ErrProtocol) {
			t.Fatalf("error outside ErrProtocol: %v", err)
		}
	})
}

func FuzzCommand(f *testing.F) {
	f.Add([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"))
	f.Add([]byte("\x04PING\x00\x0aabc"))
	f.Add([]byte("\x05ERROR\x04nope"))
	f.Fuzz(func(t *testing.T, body []byte) {
		name, data, err := parseCommand(body)
		if err != nil {
			return
		}
		if len(name) == 0 || 1+len(name)+len(data) != len(body) {
			t.Fatalf("name %q and %d data bytes from a %d-byte body", name, len(data), len(body))
		}
		if typ, id, err := parseReady(data); err == nil && (typ == "" || len(typ)+len(id) > len(data)) {
			t.Fatalf("socket type %q from %d bytes", typ, len(data))
		}
		if ctx, err := parsePing(data); err == nil && len(ctx) > maxPingContext {
			t.Fatalf("PING context of %d bytes", len(ctx))
		}
		_ = parseErrorReason(data)
	})
}

// FuzzStream feeds bytes as everything a peer sends: greeting, READY,
// commands and messages, under small caps. Nothing may panic, no message
// may exceed a cap, the budget must hold exactly the bytes received, and
// every reservation must come back.
func FuzzStream(f *testing.F) {
	f.Add(cat(rawGreeting(1), rawReady("PUB"), rawMessage([]byte("kv@a"), seq8(1), []byte("x"))))
	f.Add(cat(rawGreeting(1), longHeader(0x04, 1<<50)))
	f.Fuzz(func(t *testing.T, stream []byte) {
		opts := Options{MaxMessageSize: 4 << 10, MaxFrames: 4, MaxBufferedBytes: 8 << 10}.withDefaults()
		bud := &budget{limit: opts.MaxBufferedBytes}
		c := newConn(&streamConn{r: bytes.NewReader(stream)}, &opts, bud)
		if err := c.handshake(context.Background(), "SUB"); err != nil {
			return
		}
		c.subs = map[string]int{} // take subscriptions too, as a Pub's connection does
		for {
			frames, reserved, err := c.readMessage()
			if err != nil {
				break
			}
			var total int64
			for _, fr := range frames {
				total += int64(len(fr))
			}
			if len(frames) == 0 || len(frames) > opts.MaxFrames || total > opts.MaxMessageSize || reserved != total {
				t.Fatalf("%d frames, %d bytes, %d reserved", len(frames), total, reserved)
			}
			bud.give(reserved)
		}
		if len(c.subs) > maxSubscriptions {
			t.Fatalf("%d subscriptions held", len(c.subs))
		}
		if u := bud.used.Load(); u != 0 {
			t.Fatalf("%d bytes still reserved", u)
		}
	})
}

// streamConn is a net.Conn whose peer sends a fixed stream and reads
// whatever we write.
type streamConn struct{ r io.Reader }

func (c *streamConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *streamConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *streamConn) Close() error                     { return nil }
func (c *streamConn) LocalAddr() net.Addr              { return nil }
func (c *streamConn) RemoteAddr() net.Addr             { return nil }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }
