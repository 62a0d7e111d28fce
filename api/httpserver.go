package api

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTPLimits bound what one HTTP client can hold: a connection that sends
// its headers or body slower than the timeouts allow is closed, idle
// keep-alive connections are closed after IdleTimeout, and headers are
// capped. Zero fields take the defaults of Options (options.go).
type HTTPLimits struct {
	ReadHeaderTimeout time.Duration
	// ReadTimeout covers the whole request, body included: a body that never
	// finishes is cut off after it.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	IdleTimeout  time.Duration
	// MaxHeaderBytes caps the request line and headers.
	MaxHeaderBytes int
	// HeaderBudget caps the request line and header bytes of all requests
	// in progress together. MaxHeaderBytes bounds one request, but a client
	// can open --http-max-conns connections, send large headers on each and
	// then trickle the body for ReadTimeout, and the parsed headers cost
	// about ten times their size in memory. A request that would exceed
	// the budget is answered 503 at once (Connection: close).
	HeaderBudget int64
}

// Defaults for HTTPLimits. A 1M-token score body is ~8 MB of JSON: 30 s is
// 270 KB/s, far below any network a router sits on.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	// DefaultHeaderBudget holds 512 requests at the header cap, or some
	// 60,000 ordinary ones (~500 bytes).
	DefaultHeaderBudget = 32 << 20
	// DefaultMaxConns bounds open connections per listener; kvindexd raises
	// its file limit to the hard limit at start, like every Go program.
	DefaultMaxConns = 10000
)

// NewHTTPServer returns the HTTP server for Handler with lim applied.
func (s *Server) NewHTTPServer(lim HTTPLimits) *http.Server {
	lim = lim.withDefaults()
	return &http.Server{
		Handler:           s.headerBudget(lim.HeaderBudget, s.Handler()),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
	}
}

// headerBudget answers 503 to a request whose headers would take the
// header bytes of the requests in progress past limit; the others hold
// theirs until their handler returns (a trickled body included).
func (s *Server) headerBudget(limit int64, next http.Handler) http.Handler {
	var used atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := headerBytes(r)
		if used.Add(n) > limit {
			used.Add(-n)
			s.metrics.headerBudgetRejected.Inc()
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			writeErrorStatus(w, http.StatusServiceUnavailable, errorf(codes.Unavailable,
				"the headers of the requests in progress are at --http-header-budget-bytes (%d); retry", limit))
			return
		}
		defer used.Add(-n)
		next.ServeHTTP(w, r)
	})
}

// headerBytes is the size of r's request line and headers as sent, near
// enough (net/http counts them the same way against MaxHeaderBytes).
func headerBytes(r *http.Request) int64 {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + len(r.Host) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

// ConnMetrics count the connections of the daemon's listeners.
type ConnMetrics struct {
	open   *prometheus.GaugeVec
	waited *prometheus.CounterVec
}

// NewConnMetrics registers kvindexd_open_connections{server} and
// kvindexd_connections_limited_total{server} on reg (nil = unregistered).
func NewConnMetrics(reg *prometheus.Registry) (*ConnMetrics, error) {
	m := &ConnMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvindexd_open_connections", Help: "Open client connections per server (http, grpc).",
		}, []string{"server"}),
		waited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_connections_limited_total",
			Help: "Connections that waited in the kernel backlog because the server was at its connection limit.",
		}, []string{"server"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.open, m.waited} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// LimitListener accepts at most n connections at once (n <= 0: no limit,
// still counted): at the limit, Accept waits until a connection closes, so
// extra clients wait in the kernel backlog instead of costing a goroutine
// and buffers each. The server's read timeouts make sure slots free up.
func LimitListener(l net.Listener, n int, name string, m *ConnMetrics) net.Listener {
	ll := &limitListener{Listener: l, open: m.open.WithLabelValues(name), waited: m.waited.WithLabelValues(name),
		done: make(chan struct{})}
	if n > 0 {
		ll.sem = make(chan struct{}, n)
	}
	return ll
}

type limitListener struct {
	net.Listener
	sem    chan struct{}
	open   prometheus.Gauge
	waited prometheus.Counter
	// done is closed by Close so an Accept waiting for a slot returns.
	done      chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

func (l *limitListener) Accept() (net.Conn, error) {
	if l.sem != nil {
		select {
		case l.sem <- struct{}{}:
		default:
			l.waited.Inc()
			select {
			case l.sem <- struct{}{}:
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		if l.sem != nil {
			<-l.sem
		}
		return nil, err
	}
	l.open.Inc()
	return &limitConn{Conn: c, listener: l}, nil
}

type limitConn struct {
	net.Conn
	listener *limitListener
	once     sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.listener.open.Dec()
		if c.listener.sem != nil {
			<-c.listener.sem
		}
	})
	return err
}
