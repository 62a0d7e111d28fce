package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// Raw ZMTP byte builders for the tests. They are written out by hand from
// RFC 23/37 rather than with this package's encoders, so an encoder bug
// cannot hide itself.

// rawGreeting is a greeting for ZMTP 3.minor with the NULL mechanism.
func rawGreeting(minor byte) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, minor
	copy(g[12:], "NULL")
	return g
}

// rawCommand is a short command frame: flags 0x04, one size byte, body.
func rawCommand(body []byte) []byte {
	if len(body) > 255 {
		panic("rawCommand: body too long for a short frame")
	}
	return append([]byte{0x04, byte(len(body))}, body...)
}

// rawReady is READY with one Socket-Type property.
func rawReady(socketType string) []byte {
	body := append([]byte("\x05READY\x0bSocket-Type"), 0, 0, 0, byte(len(socketType)))
	return rawCommand(append(body, socketType...))
}

// longHeader is a frame header with the 8-byte size form.
func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

// rawMessage encodes frames as one message with short or long headers.
func rawMessage(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = 0x01
		}
		if len(f) > 255 {
			b = append(b, longHeader(flags, uint64(len(f)))...)
		} else {
			b = append(b, flags, byte(len(f)))
		}
		b = append(b, f...)
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// readRawFrame reads one frame the way the RFC lays it out.
func readRawFrame(r io.Reader) (flags byte, body []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:2]); err != nil {
		return 0, nil, err
	}
	size := uint64(h[1])
	if h[0]&0x02 != 0 {
		if _, err := io.ReadFull(r, h[2:9]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if size > 1<<20 {
		return 0, nil, errors.New("test peer: frame too large")
	}
	body = make([]byte, size)
	_, err = io.ReadFull(r, body)
	return h[0], body, err
}

func dialRaw(t *testing.T, addr net.Addr) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// handshakeAsPub performs a ZMTP 3.minor handshake as a PUB over c and
// returns the frame that follows our READY on the server side (its first
// subscription).
func handshakeAsPub(t *testing.T, c net.Conn, minor byte) (flags byte, sub []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	write(t, c, cat(rawGreeting(minor), rawReady("PUB")))
	g := make([]byte, 64)
	if _, err := io.ReadFull(c, g); err != nil {
		t.Fatal(err)
	}
	if g[0] != 0xff || g[9] != 0x7f || g[10] != 3 || g[11] != 1 || string(g[12:16]) != "NULL" {
		t.Fatalf("server greeting % x", g)
	}
	flags, ready, err := readRawFrame(c)
	if err != nil || flags != 0x04 || !bytes.HasPrefix(ready, []byte("\x05READY")) {
		t.Fatalf("server READY: flags %#x %q %v", flags, ready, err)
	}
	if !bytes.Contains(ready, []byte("Socket-Type\x00\x00\x00\x03SUB")) {
		t.Fatalf("server READY %q", ready)
	}
	flags, sub, err = readRawFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	return flags, sub
}

// expectClosed reads until the server closes c; failing if it has not
// within a generous bound.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server did not close the connection")
	}
}

// expectGoodPublisher checks that a well-behaved publisher still gets a
// message through sub.
func expectGoodPublisher(t *testing.T, sub *Sub) {
	t.Helper()
	c := dialRaw(t, sub.Addr())
	if flags, s := handshakeAsPub(t, c, 1); flags != 0x04 || string(s) != "\x09SUBSCRIBEkv@" {
		t.Fatalf("subscription: flags %#x %q", flags, s)
	}
	write(t, c, rawMessage([]byte("kv@good"), seq8(7), []byte("payload")))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := sub.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frames) != 3 || string(m.Frames[0]) != "kv@good" || string(m.Frames[2]) != "payload" ||
		m.Peer != c.LocalAddr().String() {
		t.Fatalf("good publisher's message: %q from %s", m.Frames, m.Peer)
	}
}
