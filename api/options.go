package api

import (
	"errors"

	"github.com/kvindex/kvindex/internal/option"
)

// Options is the one declaration of the server's tunables: HTTPLimits, the
// connection caps and gRPC idle bound the daemon applies around the
// listeners, Config.MaxBodyBytes and Config.ApplyStallTimeout. Each row's
// default, range and help; DefaultHTTPLimits, ValidateHTTPLimits,
// NewHTTPServer's reading of a zero field and kvindexd's flags all read it.
//
// In Config, 0 is itself a setting for MaxBodyBytes (no cap beyond each
// handler's own) and ApplyStallTimeout (readiness ignores the apply path);
// in HTTPLimits a zero field is the row's default.
var Options = struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout option.Duration
	MaxHeaderBytes, HeaderBudget, MaxBodyBytes, BodyBudget    option.Int
	HTTPMaxConns, GRPCMaxConns, GRPCMaxStreams                option.Int
	GRPCIdleTimeout, ApplyStallTimeout                        option.Duration
	MaxTenants                                                option.Int
}{
	ReadHeaderTimeout: option.Duration{Name: "http-read-header-timeout", Default: DefaultReadHeaderTimeout, Range: option.NonNegative,
		Help: "time a client has to send its request headers"},
	ReadTimeout: option.Duration{Name: "http-read-timeout", Default: DefaultReadTimeout, Range: option.NonNegative,
		Help: "time a client has to send its whole request, body included"},
	WriteTimeout: option.Duration{Name: "http-write-timeout", Default: DefaultWriteTimeout, Range: option.NonNegative,
		Help: "time to answer one request"},
	IdleTimeout: option.Duration{Name: "http-idle-timeout", Default: DefaultIdleTimeout, Range: option.NonNegative,
		Help: "keep-alive connections idle this long are closed"},
	MaxHeaderBytes: option.Int{Name: "http-max-header-bytes", Default: DefaultMaxHeaderBytes, Min: 0, Max: 16 << 20,
		Help: "request line + headers cap"},
	HeaderBudget: option.Int{Name: "http-header-budget-bytes", Default: DefaultHeaderBudget, Min: 1, Max: 1 << 40,
		Help: "request line + header bytes of all HTTP requests and gRPC header blocks in progress together; beyond it a request is answered 503 (gRPC: Unavailable) at once"},
	// A 1M-token request is ~8 MB of JSON.
	MaxBodyBytes: option.Int{Name: "http-max-body-bytes", Default: 64 << 20, Min: 0, Max: 1 << 32,
		Help: "request body cap (larger: 413)"},
	BodyBudget: option.Int{Name: "http-body-budget-bytes", Default: DefaultBodyBudget, Min: 1, Max: 1 << 40,
		Help: "bytes of all HTTP request bodies over 1 MiB in progress together (reserved by Content-Length, or the body cap for a chunked body); a body finding no room within 2 s is answered 503"},
	HTTPMaxConns: option.Int{Name: "http-max-conns", Default: DefaultMaxConns, Min: 0, Max: 1 << 20,
		Help: "open HTTP connections at most; at the cap a connection with no request in progress gives way to a new one, else it waits in the kernel backlog (0 = no limit)"},
	GRPCMaxConns: option.Int{Name: "grpc-max-conns", Default: DefaultMaxConns, Min: 0, Max: 1 << 20,
		Help: "open gRPC connections at most; at the cap a connection with no call in flight gives way to a new one (0 = no limit)"},
	// gRPC's own default is unlimited: one connection could hold a
	// goroutine per stream whose request message never comes. 128 is
	// nginx's http2_max_concurrent_streams (HTTP/2 recommends at least
	// 100); a router multiplexing more calls opens another connection.
	GRPCMaxStreams: option.Int{Name: "grpc-max-streams", Default: 128, Min: 1, Max: 1 << 16,
		Help: "concurrent gRPC calls per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a client past it waits for a call to end, a stream opened anyway is refused (REFUSED_STREAM)"},
	GRPCIdleTimeout: option.Duration{Name: "grpc-idle-timeout", Default: DefaultIdleTimeout, Range: option.Positive,
		Help: "gRPC connections without a call this long are closed (GOAWAY, then closed within 5 s even if the client ignores it)"},
	ApplyStallTimeout: option.Duration{Name: "apply-stall-timeout", Default: DefaultApplyStallTimeout, Range: option.NonNegative,
		Help: "not ready while an event worker has been inside one index write (one batch) this long: " +
			"the backend hangs (0 = readiness ignores the apply path; a pod's own lag is in its scores, never in readiness)"},
	// Each tenant is a namespace of models with its own index entries; the
	// cap bounds the namespaces a registering client can open.
	MaxTenants: option.Int{Name: "max-tenants", Default: 64, Min: 1, Max: 1 << 16,
		Help: "tenants (Dynamo's tenant_id / routing_group) besides \"default\" that may hold registered workers at once; POST /register for one more is refused (409)"},
}

// DefaultHTTPLimits is HTTPLimits with every field at its default.
func DefaultHTTPLimits() HTTPLimits { return HTTPLimits{}.withDefaults() }

// EffectiveHTTPLimits is l with each zero field at its default.
func EffectiveHTTPLimits(l HTTPLimits) HTTPLimits { return l.withDefaults() }

// ValidateHTTPLimits checks l against the ranges of Options (a zero field is
// valid: it stands for the default).
func ValidateHTTPLimits(l HTTPLimits) error {
	l = l.withDefaults()
	o := &Options
	return errors.Join(o.ReadHeaderTimeout.Check(l.ReadHeaderTimeout), o.ReadTimeout.Check(l.ReadTimeout),
		o.WriteTimeout.Check(l.WriteTimeout), o.IdleTimeout.Check(l.IdleTimeout),
		o.MaxHeaderBytes.Check(int64(l.MaxHeaderBytes)), o.HeaderBudget.Check(l.HeaderBudget))
}

// withDefaults is the one place a zero field of HTTPLimits becomes its
// default.
func (l HTTPLimits) withDefaults() HTTPLimits {
	o := &Options
	l.ReadHeaderTimeout = o.ReadHeaderTimeout.Or(l.ReadHeaderTimeout)
	l.ReadTimeout = o.ReadTimeout.Or(l.ReadTimeout)
	l.WriteTimeout = o.WriteTimeout.Or(l.WriteTimeout)
	l.IdleTimeout = o.IdleTimeout.Or(l.IdleTimeout)
	l.MaxHeaderBytes = int(o.MaxHeaderBytes.Or(int64(l.MaxHeaderBytes)))
	l.HeaderBudget = o.HeaderBudget.Or(l.HeaderBudget)
	return l
}
