package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// readBufSize is each connection's bufio size; bodies larger than it
	// are read straight into their own buffers.
	readBufSize = 8 << 10
	// firstChunk is the most a frame body gets before any of its bytes
	// arrive. Beyond it the buffer grows only when full, to growFactor times
	// its size (capped at the declared size): a peer declaring a huge frame
	// and sending little costs little, and a large frame that does arrive is
	// copied a few times, not many.
	firstChunk = 16 << 10
	growFactor = 4
)

var errNoFrames = errors.New("zmtp: a message needs at least one frame")

// longAgo is a deadline in the past: setting it wakes a blocked read/write.
var longAgo = time.Unix(1, 0)

// conn is one ZMTP connection after the transport connect.
type conn struct {
	nc     net.Conn
	r      *bufio.Reader
	opts   *Options
	budget *budget
	peer   string
	minor  byte // negotiated: 0 = ZMTP 3.0, 1 = 3.1
	// idle, once set (after the handshake, heartbeats on), is how long a
	// read may wait for the next byte.
	idle time.Duration
	// msgDeadline, while a message is being read, is when it must be
	// whole (MessageTimeout after its first byte); armed is the read
	// deadline last set on nc, so an unchanged one costs nothing.
	msgDeadline time.Time
	armed       time.Time
	// lastMsg is when the connection last delivered a message (or finished
	// its handshake), unix nanoseconds; inMsg is set while a message is
	// being read. Both are read by a full socket choosing whom to evict.
	lastMsg    atomic.Int64
	inMsg      atomic.Bool
	handshaked atomic.Bool
	// Bound sockets only, under socket.mu but for the atomics: host is the
	// peer's host; unknown says it is counted in socket.unknownOpen (its
	// host had not delivered a message); released, that its slot was given
	// back (evicted, or ended).
	host     string
	bound    bool
	unknown  atomic.Bool
	released bool
	hdr      [8]byte // frame header scratch, not a local: it would escape per frame

	identity  []byte // the peer's Identity property
	routingID string // ROUTER: how Recv names this peer and Send finds it

	// Publisher side: the peer's subscriptions (prefix -> count, as
	// libzmq counts repeated subscriptions) once ready is set.
	subsMu sync.Mutex
	subs   map[string]int
	ready  atomic.Bool

	writeMu sync.Mutex // one writer at a time: the frames of a message stay together

	failOnce sync.Once
	failErr  error
	done     chan struct{} // closed by fail
}

func newConn(nc net.Conn, opts *Options, bud *budget) *conn {
	peer := "unknown"
	if a := nc.RemoteAddr(); a != nil && a.String() != "" {
		peer = a.String()
	}
	c := &conn{nc: nc, opts: opts, budget: bud, peer: peer, done: make(chan struct{})}
	c.r = bufio.NewReaderSize(idleReader{c}, readBufSize)
	return c
}

// idleReader re-arms the read deadline before every read, so heartbeats
// measure silence (no byte for HeartbeatTimeout), not how long a large
// message takes to arrive.
type idleReader struct{ c *conn }

func (r idleReader) Read(b []byte) (int, error) {
	c := r.c
	var d time.Time
	if c.idle > 0 {
		d = time.Now().Add(c.idle)
	}
	if !c.msgDeadline.IsZero() && (d.IsZero() || c.msgDeadline.Before(d)) {
		d = c.msgDeadline
	}
	if !d.Equal(c.armed) {
		if err := c.nc.SetReadDeadline(d); err != nil {
			return 0, err
		}
		c.armed = d
	}
	return c.nc.Read(b)
}

// fail closes the connection, keeping the first reason.
func (c *conn) fail(err error) {
	c.failOnce.Do(func() {
		c.failErr = err
		close(c.done)
		_ = c.nc.Close()
	})
}

// cause prefers the reason recorded by fail (a write error, a heartbeat
// timeout) over the read error it provoked.
func (c *conn) cause(readErr error) error {
	select {
	case <-c.done:
		if c.failErr != nil {
			return c.failErr
		}
	default:
	}
	return readErr
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// handshake exchanges greetings and READY under one deadline (the earlier of
// HandshakeTimeout and ctx's), and checks the peer's socket type.
func (c *conn) handshake(ctx context.Context, ourType string) error {
	deadline := time.Now().Add(c.opts.HandshakeTimeout)
	d, fromCtx := ctx.Deadline()
	if fromCtx = fromCtx && d.Before(deadline); fromCtx {
		deadline = d
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(longAgo) })
	err := c.exchange(ourType)
	if stop() && err == nil {
		return c.nc.SetDeadline(time.Time{})
	}
	// ctx first: its deadline and the connection's may expire together.
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w (peer %s)", ErrHandshakeTimeout, ctxErr, c.peer)
		}
		return fmt.Errorf("zmtp: handshake with %s: %w", c.peer, ctxErr)
	}
	if isTimeout(err) {
		if fromCtx { // the connection's deadline (ctx's) came before ctx's own timer
			return fmt.Errorf("%w: %w (peer %s)", ErrHandshakeTimeout, context.DeadlineExceeded, c.peer)
		}
		return fmt.Errorf("%w after %v (peer %s)", ErrHandshakeTimeout, c.opts.HandshakeTimeout, c.peer)
	}
	return fmt.Errorf("zmtp: handshake with %s: %w", c.peer, err)
}

func (c *conn) exchange(ourType string) error {
	// The whole greeting goes out at once: libzmq sends its signature,
	// waits for ours, then sends the rest of its greeting.
	if _, err := c.nc.Write(ourGreeting()); err != nil {
		return err
	}
	var g [greetingLen]byte
	if _, err := io.ReadFull(c.r, g[:signatureLen]); err != nil {
		return err
	}
	if err := checkSignature(g[:signatureLen]); err != nil {
		return err
	}
	if _, err := io.ReadFull(c.r, g[signatureLen:]); err != nil {
		return err
	}
	minor, err := parseGreeting(g[:])
	if err != nil {
		return err
	}
	c.minor = minor
	ready := appendCommand(nil, "READY", appendProperty(nil, "Socket-Type", ourType))
	if _, err := c.nc.Write(ready); err != nil {
		return err
	}
	flags, size, err := c.readHeader()
	if err != nil {
		return err
	}
	if flags&flagCommand == 0 {
		return protoErr("message frame before READY")
	}
	body, err := c.readCommand(size)
	if err != nil {
		return err
	}
	name, data, err := parseCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "READY":
		peerType, identity, err := parseReady(data)
		if err != nil {
			return err
		}
		c.identity = identity
		if !compatible(ourType, peerType) {
			return protoErr("a %s socket cannot talk to a %s peer", ourType, printable([]byte(peerType)))
		}
		return nil
	case "ERROR":
		return fmt.Errorf("%w: %q", ErrPeerError, parseErrorReason(data))
	}
	return protoErr("expected READY, got command %q", printable([]byte(name)))
}

// readHeader reads a frame's flags and declared size. Nothing is allocated
// from the size here: callers compare it with their caps first.
func (c *conn) readHeader() (flags byte, size uint64, err error) {
	h := c.hdr[:]
	if _, err := io.ReadFull(c.r, h[:1]); err != nil {
		return 0, 0, err
	}
	flags = h[0]
	if flags&flagReserved != 0 {
		return 0, 0, protoErr("reserved frame flag bits set (%#02x)", flags)
	}
	if flags&flagCommand != 0 && flags&flagMore != 0 {
		return 0, 0, protoErr("command frame with MORE set")
	}
	if flags&flagLong == 0 {
		if _, err := io.ReadFull(c.r, h[:1]); err != nil {
			return 0, 0, err
		}
		return flags, uint64(h[0]), nil
	}
	if _, err := io.ReadFull(c.r, h); err != nil {
		return 0, 0, err
	}
	return flags, binary.BigEndian.Uint64(h), nil
}

// readCommand reads a command body of the declared size, capped.
func (c *conn) readCommand(size uint64) ([]byte, error) {
	if size > maxCommandSize {
		return nil, fmt.Errorf("%w: command frame declares %d bytes (max %d)", ErrTooLarge, size, maxCommandSize)
	}
	b, _, err := readBody(c.r, int(size), nil, 0)
	return b, err
}

// readBody reads n bytes, growing the buffer as they arrive. With a budget,
// every capacity increase is reserved first, for a message already holding
// held bytes; the reservation is returned (also on error) for the caller to
// give back.
func readBody(r io.Reader, n int, bud *budget, held int64) (b []byte, reserved int64, err error) {
	grow := func(newCap int) bool {
		if bud != nil {
			if !bud.take(int64(newCap-cap(b)), held+reserved+int64(newCap)) {
				return false
			}
			reserved += int64(newCap - cap(b))
		}
		nb := make([]byte, len(b), newCap)
		copy(nb, b)
		b = nb
		return true
	}
	if !grow(min(n, firstChunk)) {
		return nil, reserved, ErrBufferBudget
	}
	for len(b) < n {
		if len(b) == cap(b) && !grow(min(n, growFactor*cap(b))) {
			return nil, reserved, ErrBufferBudget
		}
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, reserved, err
		}
	}
	return b, reserved, nil
}

// readMessage reads frames until one without MORE, answering commands on
// the way. It returns the budget reserved for the frames; on error it has
// already given it back.
func (c *conn) readMessage() (frames [][]byte, reserved int64, err error) {
	defer func() {
		c.msgDeadline = time.Time{}
		c.inMsg.Store(false)
		if err != nil {
			c.budget.give(reserved)
			reserved = 0
			frames = nil
		}
	}()
	limit := uint64(c.opts.MaxMessageSize)
	var total uint64
	for {
		if len(frames) == 0 {
			// Waiting for a message costs no budget and has no deadline
			// (idle peers are bounded by heartbeats and eviction); from
			// its first byte on, the message has MessageTimeout to arrive.
			c.msgDeadline = time.Time{}
			if _, err := c.r.Peek(1); err != nil {
				return nil, reserved, c.readErr(err)
			}
			c.msgDeadline = time.Now().Add(c.opts.MessageTimeout)
			c.inMsg.Store(true)
		}
		flags, size, err := c.readHeader()
		if err != nil {
			return nil, reserved, c.lost(c.readErr(err))
		}
		if flags&flagCommand != 0 {
			// A command between messages cuts none short.
			body, err := c.readCommand(size)
			if err == nil {
				err = c.handleCommand(body)
			} else {
				err = c.readErr(err)
			}
			if err != nil && len(frames) > 0 {
				err = c.lost(err)
			}
			if err != nil {
				return nil, reserved, err
			}
			continue
		}
		if len(frames) == c.opts.MaxFrames {
			return nil, reserved, c.lost(fmt.Errorf("%w: more than %d frames", ErrTooManyFrames, c.opts.MaxFrames))
		}
		if size > limit-total {
			return nil, reserved, c.lost(fmt.Errorf("%w: frame declares %d bytes after %d (max %d per message)",
				ErrTooLarge, size, total, limit))
		}
		body, r, err := readBody(c.r, int(size), c.budget, reserved)
		reserved += r
		if err != nil {
			return nil, reserved, c.lost(c.readErr(err))
		}
		if frames == nil {
			frames = make([][]byte, 0, min(c.opts.MaxFrames, 4)) // vLLM sends 3
		}
		frames = append(frames, body)
		total += size
		if flags&flagMore == 0 {
			return frames, reserved, nil
		}
	}
}

// lost marks err as having cut a message short: whatever the peer was
// sending is gone, which callers that track streams must hear (a message is
// not a command: a connection ending between messages loses nothing of
// ours).
func (*conn) lost(err error) error {
	return fmt.Errorf("%w: %w", ErrMessageLost, err)
}

func (c *conn) readErr(err error) error {
	if !c.msgDeadline.IsZero() && isTimeout(err) && !time.Now().Before(c.msgDeadline) {
		return fmt.Errorf("%w (%v, peer %s)", ErrMessageTimeout, c.opts.MessageTimeout, c.peer)
	}
	if c.idle > 0 && isTimeout(err) {
		return fmt.Errorf("%w (%v, peer %s)", ErrHeartbeatTimeout, c.opts.HeartbeatTimeout, c.peer)
	}
	return c.cause(err)
}

// handleCommand answers a command received after the handshake. Commands
// this package has no use for (SUBSCRIBE and CANCEL reach only publishers;
// RFC 37 lets later versions add more) are ignored.
func (c *conn) handleCommand(body []byte) error {
	name, data, err := parseCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "PING":
		pingCtx, err := parsePing(data)
		if err != nil {
			return err
		}
		return c.writeRaw(appendCommand(nil, "PONG", pingCtx))
	case "ERROR":
		return fmt.Errorf("%w: %q", ErrPeerError, parseErrorReason(data))
	case "READY":
		return protoErr("READY after the handshake")
	case "SUBSCRIBE", "CANCEL":
		if c.subs != nil {
			return c.subscribe(name == "SUBSCRIBE", data)
		}
	}
	return nil
}

// subscribe records a subscribing peer's SUBSCRIBE or CANCEL. The number and
// length of subscriptions are capped: they are held for the connection's life.
func (c *conn) subscribe(on bool, topic []byte) error {
	if len(topic) > maxTopicSize {
		return fmt.Errorf("%w: subscription of %d bytes (max %d)", ErrTooLarge, len(topic), maxTopicSize)
	}
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	n, ok := c.subs[string(topic)]
	switch {
	case on && !ok && len(c.subs) >= maxSubscriptions:
		return fmt.Errorf("%w: more than %d subscriptions", ErrTooLarge, maxSubscriptions)
	case on:
		c.subs[string(topic)] = n + 1
	case n > 1:
		c.subs[string(topic)] = n - 1
	default:
		delete(c.subs, string(topic))
	}
	return nil
}

// wants reports whether the peer subscribed to a prefix of topic.
func (c *conn) wants(topic []byte) bool {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	for t := range c.subs {
		if bytes.HasPrefix(topic, []byte(t)) {
			return true
		}
	}
	return false
}

// writeRaw writes ready-made frames under WriteTimeout. A failed write
// leaves the stream mid-frame, so it ends the connection.
func (c *conn) writeRaw(b []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.nc.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout)); err != nil {
		return err
	}
	if _, err := c.nc.Write(b); err != nil {
		err = fmt.Errorf("zmtp: write to %s: %w", c.peer, err)
		c.fail(err)
		return err
	}
	return nil
}

// writeMessage sends frames as one message, the bodies written in place
// (writev) rather than copied.
func (c *conn) writeMessage(ctx context.Context, frames [][]byte) error {
	if len(frames) == 0 {
		return errNoFrames
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	select {
	case <-c.done:
		if c.failErr == nil {
			return ErrClosed
		}
		return c.failErr
	default:
	}
	deadline := time.Now().Add(c.opts.WriteTimeout)
	ctxDeadline := false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxDeadline = d, true
	}
	if err := c.nc.SetWriteDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetWriteDeadline(longAgo) })
	defer stop()
	hdrs := make([]byte, 0, 9*len(frames)) // never reallocated: slices below stay valid
	bufs := make(net.Buffers, 0, 2*len(frames))
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		start := len(hdrs)
		hdrs = appendFrameHeader(hdrs, flags, len(f))
		bufs = append(bufs, hdrs[start:], f)
	}
	if _, err := bufs.WriteTo(c.nc); err != nil {
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case ctxDeadline && errors.Is(err, os.ErrDeadlineExceeded):
			// The socket deadline is the context's and can fire a moment
			// before the context's own timer marks it done.
			err = context.DeadlineExceeded
		}
		err = fmt.Errorf("zmtp: send to %s: %w", c.peer, err)
		c.fail(err)
		return err
	}
	return nil
}

// heartbeat sends PINGs until the connection ends. The TTL asks the peer to
// drop us too if our PINGs stop.
func (c *conn) heartbeat() {
	t := time.NewTicker(c.opts.HeartbeatInterval)
	defer t.Stop()
	var ttl [2]byte
	binary.BigEndian.PutUint16(ttl[:], uint16(min(c.opts.HeartbeatTimeout/(100*time.Millisecond), 0xffff)))
	ping := appendCommand(nil, "PING", ttl[:])
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if c.writeRaw(ping) != nil {
				return
			}
		}
	}
}
