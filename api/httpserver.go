package api

import (
	"net/http"
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

// NewHTTPServer returns the HTTP server for Handler with lim applied. Served
// on a LimitListener, its connections count their unparsed header bytes
// against the header budget and tell the listener which are inside a
// request.
func (s *Server) NewHTTPServer(lim HTTPLimits) *http.Server {
	lim = lim.withDefaults()
	b := s.headerBudgetFor(lim.HeaderBudget) // shared with gRPC (GRPCHeaderBudget)
	return &http.Server{
		Handler:           s.headerBudget(b, s.Handler()),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         trackHTTP(b),
	}
}

// headerBudget is the request line and header bytes of the HTTP requests
// in progress: raw bytes while a connection reads them (limitConn.Read),
// then the parsed headers until the request's handler returns.
type headerBudget struct {
	limit    int64
	used     atomic.Int64
	rejected prometheus.Counter
}

// smallHeaders is what one request's unparsed headers may hold in the last
// quarter of the budget: requests with large headers can take three
// quarters of it, never the room ordinary ones (~500 bytes) need.
const smallHeaders = 8 << 10

// take adds n raw header bytes of a connection that now holds held; false
// (nothing added) when they do not fit.
func (b *headerBudget) take(n, held int64) bool {
	u := b.used.Add(n)
	if u <= b.limit && (held <= smallHeaders || u <= b.limit/4*3) {
		return true
	}
	b.used.Add(-n)
	return false
}

func (b *headerBudget) rejectedEarly() { b.rejected.Inc() }

// headerBudget answers 503 to a request whose headers would take the
// header bytes of the requests in progress past the budget; the others
// hold theirs until their handler returns (a trickled body included).
func (s *Server) headerBudget(b *headerBudget, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := headerBytes(r)
		if b.used.Add(n) > b.limit {
			b.used.Add(-n)
			b.rejected.Inc()
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "1")
			writeErrorStatus(w, http.StatusServiceUnavailable, errorf(codes.Unavailable,
				"the headers of the requests in progress are at --http-header-budget-bytes (%d); retry", b.limit))
			return
		}
		defer b.used.Add(-n)
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
