package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/internal/unixsock"
)

// Message is one multipart message and the address of the peer it came from.
type Message struct {
	Frames [][]byte
	Peer   string
	// from is the connection it came on, for Sub.MarkUseful.
	from *conn
}

type item struct {
	msg      Message
	reserved int64 // budget held until Recv hands the message over
}

// socket is what Sub and Dealer share: connections feeding one queue.
type socket struct {
	typ      string
	opts     Options
	topics   [][]byte // SUB: subscribed prefixes
	counters *Counters
	budget   budget

	msgs      chan item
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup

	ln net.Listener // bound sockets

	mu    sync.Mutex
	conns map[*conn]struct{}
	// Bound sockets: open counts the accepted connections (MaxConns),
	// unknownOpen those from hosts not in known, the hosts that delivered a
	// message (bounded by maxKnownHosts).
	open, unknownOpen int
	known             map[string]struct{}
	routes            map[string]*conn // ROUTER: routing id -> connection
	nextID            uint32           // ROUTER: for generated routing ids

	// Dialled sockets have one connection; dead closes when it ends, with
	// deadErr saying why.
	dead    chan struct{}
	deadErr error
}

func newSocket(typ string, opts Options, topics []string) *socket {
	opts = opts.withDefaults()
	s := &socket{typ: typ, opts: opts, counters: opts.Counters, msgs: make(chan item, opts.RecvQueue),
		done: make(chan struct{}), conns: map[*conn]struct{}{}, routes: map[string]*conn{}, known: map[string]struct{}{},
		budget: newBudget(opts)}
	if s.counters == nil {
		s.counters = &Counters{}
	}
	for _, t := range topics {
		s.topics = append(s.topics, []byte(t))
	}
	return s
}

// parseEndpoint maps a ZeroMQ endpoint onto a Go network and address:
// tcp://host:port ("*" = every interface) and ipc://path (a Unix socket).
func parseEndpoint(ep string) (network, address string, err error) {
	scheme, rest, _ := strings.Cut(ep, "://")
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", ep, err)
		}
		if host == "*" {
			host = ""
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("zmtp: endpoint %q: empty path", ep)
		}
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("zmtp: endpoint %q: only tcp:// and ipc:// are supported", ep)
}

func (s *socket) listen(endpoint string) error {
	network, addr, err := parseEndpoint(endpoint)
	if err != nil {
		return err
	}
	var ln net.Listener
	if network == "unix" {
		// As the HTTP and gRPC unix sockets: mode 0660 whatever the umask,
		// and a stale file left by a killed daemon is replaced (only when
		// nothing accepts on it), so a restart is not a crash loop.
		ln, err = unixsock.Listen(addr, unixsock.Mode)
	} else {
		ln, err = net.Listen(network, addr)
	}
	if err != nil {
		return fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

// acceptLoop only accepts: every handshake runs on its connection's own
// goroutine, so a silent or slow peer never delays the next one.
func (s *socket) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off, as
			// net/http does, instead of spinning.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-s.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		c := s.admit(nc)
		if c == nil {
			s.counters.rejected.Add(1)
			_ = nc.Close()
			continue
		}
		s.counters.accepted.Add(1)
		s.wg.Add(1)
		go s.serveAccepted(c)
	}
}

// maxKnownHosts bounds the hosts remembered as having delivered a message,
// in MaxConns: beyond it an arbitrary one is forgotten.
const maxKnownHosts = 4

// reservedConns is how many of a bound socket's last slots only known
// hosts may take.
func (s *socket) reservedConns() int { return s.opts.MaxConns / 8 }

// admit decides whether a new connection gets a slot, evicting an idle
// connection if that makes room, and tracks it; nil: refused (or the socket
// is closed). A host that never delivered a message may not take the
// reserved slots: a flood of strangers leaves room for engines that
// reconnect.
func (s *socket) admit(nc net.Conn) *conn {
	host := hostOf(nc.RemoteAddr())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed() {
		return nil
	}
	_, known := s.known[host]
	unknownFull := !known && s.unknownOpen >= s.opts.MaxConns-s.reservedConns()
	if s.open >= s.opts.MaxConns || unknownFull {
		if !s.evictLocked(unknownFull) {
			return nil
		}
	}
	c := newConn(nc, &s.opts, &s.budget)
	c.host, c.bound = host, true
	c.unknown.Store(!known)
	s.open++
	if !known {
		s.unknownOpen++
	}
	s.conns[c] = struct{}{}
	s.counters.open.Add(1)
	return c
}

// evictLocked closes the handshaked connection idle the longest, if one
// has delivered nothing for EvictIdleAfter and is not mid-message (from a
// host not known, when onlyUnknown), and gives its slot back at once.
func (s *socket) evictLocked(onlyUnknown bool) bool {
	cutoff := time.Now().Add(-s.opts.EvictIdleAfter).UnixNano()
	var victim *conn
	for c := range s.conns {
		if !c.bound || !c.handshaked.Load() || c.inMsg.Load() || c.lastMsg.Load() > cutoff {
			continue
		}
		unknown := c.unknown.Load()
		if onlyUnknown && !unknown {
			continue
		}
		// Strangers go first, then the longest idle.
		if victim == nil || (unknown && !victim.unknown.Load()) ||
			(unknown == victim.unknown.Load() && c.lastMsg.Load() < victim.lastMsg.Load()) {
			victim = c
		}
	}
	if victim == nil {
		return false
	}
	s.releaseLocked(victim)
	victim.fail(ErrEvicted)
	return true
}

// releaseLocked gives a bound connection's slot back, once.
func (s *socket) releaseLocked(c *conn) {
	if !c.bound || c.released {
		return
	}
	c.released = true
	s.open--
	if c.unknown.Load() {
		s.unknownOpen--
	}
}

// delivered records that c delivered a message: it is not idle, and its
// host is known from now on.
func (s *socket) delivered(c *conn) {
	c.lastMsg.Store(time.Now().UnixNano())
	if !c.unknown.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.released && c.unknown.Load() {
		s.unknownOpen--
	}
	c.unknown.Store(false)
	if len(s.known) >= maxKnownHosts*s.opts.MaxConns {
		for h := range s.known {
			delete(s.known, h)
			break
		}
	}
	s.known[c.host] = struct{}{}
}

// hostOf is the host part of a peer's address (every Unix-socket peer is
// one host).
func hostOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

func (s *socket) serveAccepted(c *conn) {
	defer s.wg.Done()
	err := s.guard(func() error {
		if err := c.handshake(context.Background(), s.typ); err != nil {
			return err
		}
		return s.serve(c)
	})
	s.finish(c, err)
}

// dial connects and handshakes before returning, so a refused connection,
// a timeout or a hostile peer is the caller's error.
func dial(ctx context.Context, endpoint, typ string, opts Options, topics []string) (*socket, *conn, error) {
	network, addr, err := parseEndpoint(endpoint)
	if err != nil {
		return nil, nil, err
	}
	s := newSocket(typ, opts, topics)
	d := net.Dialer{Timeout: s.opts.HandshakeTimeout}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, nil, fmt.Errorf("zmtp: connect %s: %w", endpoint, err)
	}
	c := s.track(nc)
	if err := s.guard(func() error { return c.handshake(ctx, typ) }); err != nil {
		s.finish(c, err)
		return nil, nil, err
	}
	s.dead = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.guard(func() error { return s.serve(c) })
		s.deadErr = fmt.Errorf("zmtp: connection to %s ended: %w", c.peer, err)
		if s.closed() {
			s.deadErr = ErrClosed
		}
		s.finish(c, err)
		close(s.dead)
	}()
	return s, c, nil
}

// track registers a new connection so Close can end it; nil if the socket
// is already closed.
func (s *socket) track(nc net.Conn) *conn {
	c := newConn(nc, &s.opts, &s.budget)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed() {
		_ = nc.Close()
		return nil
	}
	s.conns[c] = struct{}{}
	s.counters.open.Add(1)
	return c
}

// errPanic marks a recovered panic; guard is the last resort that keeps a
// bug in this package from taking the process down.
var errPanic = errors.New("zmtp: internal error")

func (s *socket) guard(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errPanic, r)
		}
	}()
	return fn()
}

// finish ends a connection, counts why and tells OnDisconnect.
func (s *socket) finish(c *conn, err error) {
	c.fail(err)
	s.mu.Lock()
	delete(s.conns, c)
	s.releaseLocked(c)
	if s.routes[c.routingID] == c {
		delete(s.routes, c.routingID)
	}
	s.mu.Unlock()
	s.counters.open.Add(-1)
	if s.closed() {
		err = nil
	}
	s.counters.count(err)
	if s.opts.OnDisconnect != nil {
		s.opts.OnDisconnect(c.peer, err)
	}
}

func (c *Counters) count(err error) {
	if errors.Is(err, ErrMessageLost) {
		c.messagesLost.Add(1)
	}
	switch {
	case err == nil:
	case errors.Is(err, errPanic):
		c.panics.Add(1)
	case errors.Is(err, ErrHandshakeTimeout):
		c.handshakeTimeouts.Add(1)
	case errors.Is(err, ErrHeartbeatTimeout):
		c.heartbeatTimeouts.Add(1)
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrTooManyFrames):
		c.oversized.Add(1)
	case errors.Is(err, ErrBufferBudget):
		c.budget.Add(1)
	case errors.Is(err, ErrMessageTimeout):
		c.messageTimeouts.Add(1)
	case errors.Is(err, ErrEvicted):
		c.evicted.Add(1)
	case errors.Is(err, ErrProtocol):
		c.protocol.Add(1)
	case errors.Is(err, ErrPeerError):
		c.peerErrors.Add(1)
	}
}

// serve runs a connection after its handshake until something fails:
// subscribe (SUB) or take subscriptions (PUB), and queue what arrives.
func (s *socket) serve(c *conn) error {
	s.counters.handshakes.Add(1)
	c.lastMsg.Store(time.Now().UnixNano()) // idle from here
	c.handshaked.Store(true)
	switch s.typ {
	case "PUB":
		c.subsMu.Lock()
		c.subs = map[string]int{}
		c.subsMu.Unlock()
		c.ready.Store(true)
	case "ROUTER":
		s.route(c)
	case "SUB":
		var b []byte
		for _, t := range s.topics {
			if c.minor >= 1 {
				b = appendCommand(b, "SUBSCRIBE", t)
			} else { // ZMTP 3.0: a one-frame message, 1 then the prefix
				b = appendFrameHeader(b, 0, 1+len(t))
				b = append(append(b, 1), t...)
			}
		}
		if len(b) > 0 {
			if err := c.writeRaw(b); err != nil {
				return err
			}
		}
	}
	if s.opts.HeartbeatInterval > 0 && c.minor >= 1 {
		c.idle = s.opts.HeartbeatTimeout
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c.heartbeat()
		}()
	}
	for {
		frames, reserved, err := c.readMessage()
		if err != nil {
			return err
		}
		switch s.typ {
		case "SUB":
			if !s.subscribed(frames[0]) {
				s.budget.give(reserved)
				s.counters.filtered.Add(1)
				continue
			}
		case "PUB":
			// ZMTP 3.0 subscribers subscribe with messages (1 or 0, then
			// the prefix); anything else from a subscriber is ignored.
			s.budget.give(reserved)
			if len(frames) == 1 && len(frames[0]) > 0 && frames[0][0] <= 1 {
				if err := c.subscribe(frames[0][0] == 1, frames[0][1:]); err != nil {
					return err
				}
				s.delivered(c)
			}
			continue
		case "ROUTER":
			frames = append([][]byte{[]byte(c.routingID)}, frames...)
		}
		if !s.opts.UsefulMarks {
			s.delivered(c)
		}
		select {
		case s.msgs <- item{Message{frames, c.peer, c}, reserved}:
		case <-s.done:
			s.budget.give(reserved)
			return ErrClosed
		}
	}
}

// route gives a ROUTER's connection its routing id: the peer's Identity
// when it has one that is free (ids starting with a zero byte are ours),
// else a generated one, 0 then a 4-byte counter, as libzmq does.
func (s *socket) route(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := string(c.identity)
	if _, taken := s.routes[id]; id == "" || id[0] == 0 || taken {
		s.nextID++
		id = string(binary.BigEndian.AppendUint32([]byte{0}, s.nextID))
	}
	c.routingID = id
	s.routes[id] = c
}

// subscribed filters on our side too: a publisher need not filter (XPUB
// with manual subscriptions, a hostile peer), and ZMTP leaves the final
// say to the subscriber.
func (s *socket) subscribed(topic []byte) bool {
	for _, t := range s.topics {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

func (s *socket) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *socket) recv(ctx context.Context) (Message, error) {
	select {
	case it := <-s.msgs:
		return s.handOver(it), nil
	default:
	}
	select {
	case it := <-s.msgs:
		return s.handOver(it), nil
	case <-s.dead: // nil, never ready, for a bound socket
		select {
		case it := <-s.msgs: // queued before the connection ended
			return s.handOver(it), nil
		default:
			return Message{}, s.deadErr
		}
	case <-s.done:
		return Message{}, ErrClosed
	case <-ctx.Done():
		return Message{}, ctx.Err()
	}
}

func (s *socket) handOver(it item) Message {
	s.budget.give(it.reserved)
	s.counters.messages.Add(1)
	return it.msg
}

func (s *socket) close() {
	s.closeOnce.Do(func() {
		close(s.done)
		if s.ln != nil {
			_ = s.ln.Close()
		}
		s.mu.Lock()
		for c := range s.conns {
			c.fail(ErrClosed)
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
}
