package api

import (
	"container/list"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// The connection cap of each listener, and who gives way at it.
//
// A cap that only waits for a connection to close lets anyone who can open
// the cap's worth of connections, and re-dials each one the idle timeout
// closes, keep every client out for ever. So at the cap the listener evicts
// a connection that is doing nothing: one with no call in flight. It picks,
// in this order, the connection accepted longest ago that never finished a
// call (strangers and half-open handshakes first), then the one whose last
// call ended longest ago. A connection in the middle of a call is never
// evicted; only when every connection is inside a call does a new client
// wait in the kernel backlog, and calls end (the server's timeouts bound
// them). A connection that finished a call therefore outlives every
// stranger, and a new client is admitted at once; its connection is the
// newest stranger, evicted only after every stranger accepted before it,
// which is the window it has to start its first call.
//
// Which connections are busy: for HTTP the server's ConnState hook (a
// request is active from its headers to the end of its handler), for gRPC
// a stats handler (a unary call is busy from its request message to its
// end; a call that never sends its request message, and server streams
// such as Health/Watch, do not protect their connection).

// ConnMetrics count the connections of the daemon's listeners.
type ConnMetrics struct {
	open    *prometheus.GaugeVec
	waited  *prometheus.CounterVec
	evicted *prometheus.CounterVec
}

// NewConnMetrics registers kvindexd_open_connections{server},
// kvindexd_connections_limited_total{server} and
// kvindexd_connections_evicted_total{server} on reg (nil = unregistered).
func NewConnMetrics(reg *prometheus.Registry) (*ConnMetrics, error) {
	m := &ConnMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvindexd_open_connections", Help: "Open client connections per server (http, grpc).",
		}, []string{"server"}),
		waited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_connections_limited_total",
			Help: "Connections that waited in the kernel backlog because the server was at its connection limit with every connection inside a call.",
		}, []string{"server"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_connections_evicted_total",
			Help: "Connections without a call in flight closed to admit a new one at the connection limit (strangers first, then the longest idle).",
		}, []string{"server"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.open, m.waited, m.evicted} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// LimitListener accepts at most n connections at once (n <= 0: no limit,
// still counted). At the limit it evicts an idle connection (see above) to
// admit the new one; when every connection is inside a call, Accept waits
// until one closes or its call ends, so extra clients wait in the kernel
// backlog instead of costing a goroutine and buffers each (one accepted
// connection waits in Accept).
func LimitListener(l net.Listener, n int, name string, m *ConnMetrics) net.Listener {
	ll := &limitListener{Listener: l, open: m.open.WithLabelValues(name), waited: m.waited.WithLabelValues(name),
		evicted: m.evicted.WithLabelValues(name), done: make(chan struct{}), idleCh: make(chan struct{}, 1)}
	if n > 0 {
		ll.sem = make(chan struct{}, n)
	}
	return ll
}

type limitListener struct {
	net.Listener
	sem     chan struct{}
	open    prometheus.Gauge
	waited  prometheus.Counter
	evicted prometheus.Counter
	// done is closed by Close so an Accept waiting for a slot returns.
	done      chan struct{}
	closeOnce sync.Once
	// idleCh wakes an Accept waiting at the limit when a call ends.
	idleCh chan struct{}

	mu sync.Mutex
	// strangers never finished a call (in accept order); idle finished one
	// and have none in flight (least recently used first). A busy
	// connection is on neither list.
	strangers, idle list.List
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

func (l *limitListener) Accept() (net.Conn, error) {
	// The connection is taken from the backlog first: only a client that
	// is actually there may evict another (one more descriptor than the
	// cap while it waits).
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.sem != nil {
		if err := l.acquire(); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	l.open.Inc()
	lc := &limitConn{Conn: c, listener: l}
	lc.addr = connAddr{Addr: c.RemoteAddr(), conn: lc}
	l.mu.Lock()
	lc.elem = l.strangers.PushBack(lc)
	lc.on = &l.strangers
	l.mu.Unlock()
	return lc, nil
}

// acquire takes a slot, evicting an idle connection at the limit, or waits
// for one to close or become idle.
func (l *limitListener) acquire() error {
	counted := false
	for {
		select {
		case l.sem <- struct{}{}:
			return nil
		default:
		}
		if v := l.victim(); v != nil {
			l.evicted.Inc()
			_ = v.Close()
			continue
		}
		if !counted {
			l.waited.Inc()
			counted = true
		}
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-l.idleCh:
		case <-l.done:
			return net.ErrClosed
		}
	}
}

// victim takes the connection to evict off its list (nil: every connection
// is inside a call).
func (l *limitListener) victim() *limitConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lst := range []*list.List{&l.strangers, &l.idle} {
		if e := lst.Front(); e != nil {
			c := lst.Remove(e).(*limitConn)
			c.elem, c.on = nil, nil
			return c
		}
	}
	return nil
}

type limitConn struct {
	net.Conn
	listener *limitListener
	once     sync.Once
	addr     connAddr

	// Guarded by listener.mu.
	busy   int
	closed bool
	elem   *list.Element
	on     *list.List

	// httpActive is the HTTP server's view (ConnState), so that its
	// transitions count once whatever order they come in.
	httpActive atomic.Bool
	// hdr is the header budget this connection's unparsed request bytes
	// count against (HTTP only; nil: not counted); pending is what it
	// holds of it.
	hdr     *headerBudget
	pending atomic.Int64
}

// connAddr is a limitConn's RemoteAddr: the peer's address (String is
// unchanged), carrying the connection so gRPC's stats handler, which sees
// only the address, can find it.
type connAddr struct {
	net.Addr
	conn *limitConn
}

func (c *limitConn) RemoteAddr() net.Addr { return c.addr }

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		l := c.listener
		l.mu.Lock()
		c.closed = true
		if c.elem != nil {
			c.on.Remove(c.elem)
			c.elem, c.on = nil, nil
		}
		l.mu.Unlock()
		c.releaseHeaders()
		l.open.Dec()
		if l.sem != nil {
			<-l.sem
		}
	})
	return err
}

// begin marks a call in flight: the connection cannot be evicted.
func (c *limitConn) begin() {
	l := c.listener
	l.mu.Lock()
	defer l.mu.Unlock()
	c.busy++
	if c.busy == 1 && c.elem != nil {
		c.on.Remove(c.elem)
		c.elem, c.on = nil, nil
	}
}

// end marks a call finished: with none left the connection is the most
// recently used idle one, and an Accept waiting at the limit may evict.
func (c *limitConn) end() {
	l := c.listener
	l.mu.Lock()
	c.busy--
	if c.busy == 0 && !c.closed && c.elem == nil {
		c.elem = l.idle.PushBack(c)
		c.on = &l.idle
	}
	l.mu.Unlock()
	select {
	case l.idleCh <- struct{}{}:
	default:
	}
}

// Read counts the bytes of a request's line and headers against the header
// budget until the server has parsed them (ConnState active): the budget
// then bounds header memory before parsing, not only after.
func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if b := c.hdr; b != nil && n > 0 && c.countingHeaders() {
		held := c.pending.Add(int64(n))
		if !b.take(int64(n), held) {
			c.pending.Add(-int64(n))
			b.rejectedEarly()
			_ = c.Conn.Close()
			return 0, errHeaderBudget
		}
	}
	return n, err
}

func (c *limitConn) countingHeaders() bool { return !c.httpActive.Load() }

// releaseHeaders gives back what the unparsed headers held.
func (c *limitConn) releaseHeaders() {
	if n := c.pending.Swap(0); n != 0 && c.hdr != nil {
		c.hdr.used.Add(-n)
	}
}

type headerBudgetError struct{}

func (headerBudgetError) Error() string {
	return "request headers beyond --http-header-budget-bytes: connection closed"
}

var errHeaderBudget error = headerBudgetError{}

// asLimitConn finds the limitConn under c (a TLS connection wraps it).
func asLimitConn(c net.Conn) *limitConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitConn)
	return lc
}

// trackHTTP is the HTTP server's ConnState hook: a request is busy from
// its parsed headers to its handler's end; new and idle connections count
// their unparsed header bytes against b.
func trackHTTP(b *headerBudget) func(net.Conn, http.ConnState) {
	return func(nc net.Conn, st http.ConnState) {
		c := asLimitConn(nc)
		if c == nil {
			return
		}
		switch st {
		case http.StateNew:
			c.hdr = b
		case http.StateActive:
			was := c.httpActive.Swap(true)
			// The parsed headers now count in the handler (headerBudget);
			// the raw bytes read for them are given back.
			c.releaseHeaders()
			if !was {
				c.begin()
			}
		case http.StateIdle, http.StateHijacked, http.StateClosed:
			was := c.httpActive.Swap(false)
			if was {
				c.end()
			}
		}
	}
}

// GRPCConnTracking is the server option that tells the gRPC listener's
// LimitListener which connections are inside a call.
func GRPCConnTracking() grpc.ServerOption { return grpc.StatsHandler(grpcConnStats{}) }

type grpcConnStats struct{}

type (
	connKey struct{}
	rpcKey  struct{}
)

// rpcState is one call's part in its connection's busy count.
type rpcState struct {
	conn    *limitConn
	unary   bool
	counted bool
}

func (grpcConnStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if a, ok := info.RemoteAddr.(connAddr); ok {
		return context.WithValue(ctx, connKey{}, a.conn)
	}
	return ctx
}

func (grpcConnStats) HandleConn(context.Context, stats.ConnStats) {}

func (grpcConnStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	if c, _ := ctx.Value(connKey{}).(*limitConn); c != nil {
		return context.WithValue(ctx, rpcKey{}, &rpcState{conn: c})
	}
	return ctx
}

func (grpcConnStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	r, _ := ctx.Value(rpcKey{}).(*rpcState)
	if r == nil {
		return
	}
	// One call's events come from its own goroutine in order.
	switch s := s.(type) {
	case *stats.Begin:
		r.unary = !s.IsClientStream && !s.IsServerStream
	case *stats.InPayload:
		if r.unary && !r.counted {
			r.counted = true
			r.conn.begin()
		}
	case *stats.End:
		if r.counted {
			r.counted = false
			r.conn.end()
		}
	}
}
