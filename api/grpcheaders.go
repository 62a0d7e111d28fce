package api

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// gRPC header blocks count in the same header budget as HTTP requests
// (--http-header-budget-bytes), in two stages like HTTP's:
//
//   - raw: the bytes of each HTTP/2 header block (HEADERS and CONTINUATION
//     frames) count from the moment they are read off the connection (a
//     net.Conn wrapper that follows the frame layout, after TLS) until the
//     server has decoded the block: the first read after the block's last
//     byte, since gRPC's reader goroutine reads again only once it has
//     decoded and handled what it read. A connection whose block does not
//     fit is closed at once, before gRPC decodes it.
//   - decoded: the headers of a call count from gRPC's tap (after decoding,
//     before the call starts) until the call's stream ends; a call that does
//     not fit is refused with Unavailable. Calls with more than 8 KiB of
//     headers may take three quarters of the budget, as raw HTTP headers.
//
// Without this a peer could make gRPC decode --grpc-max-conns header blocks
// of --http-max-header-bytes at once, or open unlimited streams each holding
// decoded headers, outside any budget.

// GRPCHeaderBudget returns the server options that count gRPC header
// blocks in the HTTP header budget of lim (shared with NewHTTPServer):
// creds wraps the connection after its handshake (nil: plaintext), and a
// tap handle counts each call's decoded headers.
func (s *Server) GRPCHeaderBudget(lim HTTPLimits, creds credentials.TransportCredentials) []grpc.ServerOption {
	b := s.headerBudgetFor(lim.withDefaults().HeaderBudget)
	return []grpc.ServerOption{
		grpc.Creds(headerCreds{inner: creds, budget: b}),
		grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			n := int64(len(info.FullMethodName))
			for k, vs := range info.Header {
				for _, v := range vs {
					n += int64(len(k) + len(v) + 4)
				}
			}
			// as raw bytes: calls with large headers may take three quarters
			// of the budget, never the room ordinary ones need (a stream
			// waiting for its request message holds them without a time
			// limit)
			if !b.take(n, n) {
				b.rejected.Inc()
				return ctx, status.Errorf(codes.Unavailable,
					"the headers of the requests in progress are at --http-header-budget-bytes (%d); retry", b.limit)
			}
			// the stream's context ends with the stream (finished, reset or
			// its connection closed)
			context.AfterFunc(ctx, func() { b.used.Add(-n) })
			return ctx, nil
		}),
	}
}

// headerBudgetFor is the server's one header budget, made on first use:
// HTTP and gRPC share it (the first caller's limit holds; kvindexd passes
// both the same limits).
func (s *Server) headerBudgetFor(limit int64) *headerBudget {
	s.hdrOnce.Do(func() {
		s.hdrBudget = &headerBudget{limit: limit, rejected: s.metrics.headerBudgetRejected}
	})
	return s.hdrBudget
}

// headerCreds wraps each gRPC connection, after its TLS handshake if any,
// in a headerConn.
type headerCreds struct {
	inner  credentials.TransportCredentials // nil: plaintext
	budget *headerBudget
}

func (c headerCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.inner == nil {
		return conn, nil, nil
	}
	return c.inner.ClientHandshake(ctx, authority, conn)
}

func (c headerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info := raw, credentials.AuthInfo(nil)
	if c.inner != nil {
		var err error
		if conn, info, err = c.inner.ServerHandshake(raw); err != nil {
			return nil, nil, err
		}
	}
	return &headerConn{Conn: conn, budget: c.budget, preface: http2PrefaceLen}, info, nil
}

func (c headerCreds) Info() credentials.ProtocolInfo {
	if c.inner == nil {
		return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
	}
	return c.inner.Info()
}

func (c headerCreds) Clone() credentials.TransportCredentials {
	if c.inner == nil {
		return c
	}
	return headerCreds{inner: c.inner.Clone(), budget: c.budget}
}

// OverrideServerName is part of the interface (deprecated there); a
// server's credentials never need it.
func (c headerCreds) OverrideServerName(string) error { return nil }

const (
	http2PrefaceLen     = 24 // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	http2FrameHeaderLen = 9
	http2FrameHeaders   = 0x1
	http2FrameCont      = 0x9
	http2FlagEndHeaders = 0x4
)

// headerConn follows the HTTP/2 frames a client sends and counts the bytes
// of header blocks against the budget while gRPC reads and decodes them.
// Only gRPC's reader goroutine calls Read; Close may come from another.
type headerConn struct {
	net.Conn
	budget *headerBudget

	preface int                       // preface bytes still to skip
	hdr     [http2FrameHeaderLen]byte // the frame header being read
	hdrN    int
	left    int  // payload bytes of the current frame still to come
	inBlock bool // the current frame is part of a header block

	mu sync.Mutex
	// held is what this connection holds of the budget; done of it belongs
	// to blocks complete before this read, given back at the next one.
	held, done int64
	closed     bool
}

func (c *headerConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.done > 0 {
		// gRPC reads again: it has decoded and handled every complete
		// block it read before
		c.budget.used.Add(-c.done)
		c.held -= c.done
		c.done = 0
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		ok := c.closed || c.scan(p[:n])
		c.mu.Unlock()
		if !ok {
			c.budget.rejectedEarly()
			_ = c.Close()
			return 0, errHeaderBudget
		}
	}
	return n, err
}

// scan follows the frames in b; false when a header block does not fit
// the budget.
func (c *headerConn) scan(b []byte) bool {
	for len(b) > 0 {
		switch {
		case c.preface > 0:
			k := min(c.preface, len(b))
			c.preface -= k
			b = b[k:]
		case c.left > 0:
			k := min(c.left, len(b))
			c.left -= k
			b = b[k:]
			if c.inBlock && !c.take(k) {
				return false
			}
			if c.left == 0 {
				c.frameDone()
			}
		default:
			k := copy(c.hdr[c.hdrN:], b)
			c.hdrN += k
			b = b[k:]
			if c.hdrN < http2FrameHeaderLen {
				continue
			}
			c.hdrN = 0
			c.left = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
			typ := c.hdr[3]
			c.inBlock = typ == http2FrameHeaders || typ == http2FrameCont
			if c.inBlock && !c.take(http2FrameHeaderLen) {
				return false
			}
			if c.left == 0 {
				c.frameDone()
			}
		}
	}
	return true
}

// take counts k more bytes of the header block being read.
func (c *headerConn) take(k int) bool {
	if !c.budget.take(int64(k), c.held-c.done+int64(k)) {
		return false
	}
	c.held += int64(k)
	return true
}

// frameDone ends the current frame: the last of a header block makes the
// block's bytes given back at the next read.
func (c *headerConn) frameDone() {
	if c.inBlock && c.hdr[4]&http2FlagEndHeaders != 0 {
		c.done = c.held
	}
}

func (c *headerConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.budget.used.Add(-c.held)
		c.held, c.done = 0, 0
	}
	c.mu.Unlock()
	return err
}
