package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"mime"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The guard runs in front of every HTTP handler and gRPC method: it caps
// request bodies, checks the bearer token against the scope the call needs,
// and refuses admin calls that are off or not JSON. Probes stay
// unauthenticated so kubelets and load balancers need no secret.

// guardMetrics count refused requests by transport and reason.
type guardMetrics struct {
	denied *prometheus.CounterVec
}

func newGuardMetrics(reg *prometheus.Registry) (*guardMetrics, error) {
	m := &guardMetrics{denied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindexd_auth_denied_total",
		Help: "Requests refused by the access guard, by transport and reason (missing_token, bad_token, scope, admin_off).",
	}, []string{"transport", "reason"})}
	for _, tr := range []string{"http", "grpc"} {
		for _, r := range []string{"missing_token", "bad_token", "scope", "admin_off"} {
			m.denied.WithLabelValues(tr, r)
		}
	}
	return m, reg.Register(m.denied)
}

// adminEnabled reports whether endpoint management is served: only when
// asked for (Config.AdminAPI) or when an admin token exists to protect it.
func (s *Server) adminEnabled() bool {
	return s.cfg.AdminAPI || (s.cfg.Auth != nil && s.cfg.Auth.HasAdmin())
}

var errAdminOff = errorf(codes.PermissionDenied,
	"the admin API is off: start kvindexd with --admin-api, or put an admin token in --auth-token-file")

// httpScope is the scope an HTTP request needs.
func (s *Server) httpScope(r *http.Request) Scope {
	switch r.URL.Path {
	case "/healthz", "/readyz", "/health":
		return ScopeNone
	case "/":
		// The status page is a static file with no data: a browser cannot
		// send a bearer token when it opens a URL, so the page is served
		// to anyone and its script sends the token the user enters with
		// each data call (/v1/status, /v1/pods, /v1/score), which still
		// need the read scope.
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return ScopeNone
		}
	case "/metrics":
		if s.cfg.MetricsAuth {
			return ScopeRead
		}
		return ScopeNone
	case "/v1/endpoints":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return ScopeAdmin
		}
	case "/register", "/unregister", "/register_peer", "/deregister_peer", "/peers":
		// Dynamo's runtime subscriptions are endpoint management, and its
		// peer registry names whom a restart recovers from.
		return ScopeAdmin
	case "/dump":
		// Dynamo's dump is the whole index too, as the peer snapshot.
		return ScopeAdmin
	case indexer.PeerSnapshotPath:
		// the whole index: what every pod holds, for a peer to start from
		return ScopeAdmin
	}
	return ScopeRead
}

// grpcScope is the scope a gRPC method ("/pkg.Service/Method") needs.
func grpcScope(method string) Scope {
	switch {
	case strings.HasPrefix(method, "/grpc.health.v1.Health/"):
		return ScopeNone
	case method == "/kvindex.v1.Indexer/AddEndpoint", method == "/kvindex.v1.Indexer/RemoveEndpoint":
		return ScopeAdmin
	}
	return ScopeRead
}

// authorize checks a presented token against the scope needed, then
// whether an admin call is served at all; reason is empty when the call may
// proceed.
func (s *Server) authorize(need Scope, token string) (code codes.Code, reason, msg string) {
	if need == ScopeNone {
		return codes.OK, "", ""
	}
	got := ScopeAdmin
	if s.cfg.Auth != nil {
		if token == "" {
			return codes.Unauthenticated, "missing_token", "a bearer token is required (Authorization: Bearer <token>)"
		}
		if got = s.cfg.Auth.Check(token); got == ScopeNone {
			return codes.Unauthenticated, "bad_token", "the bearer token is not valid"
		}
	}
	if need == ScopeAdmin && !s.adminEnabled() {
		return codes.PermissionDenied, "admin_off", errAdminOff.Msg
	}
	if got < need {
		return codes.PermissionDenied, "scope", "this call needs a token with the " + need.String() + " scope"
	}
	return codes.OK, "", ""
}

// guard wraps the HTTP handler.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		need := s.httpScope(r)
		if s.peerCall(r) {
			need = ScopeNone // the peer token was checked; it grants this one path
		}
		if code, reason, msg := s.authorize(need, bearer(r.Header.Get("Authorization"))); code != codes.OK {
			s.guardMetrics.denied.WithLabelValues("http", reason).Inc()
			if code == codes.Unauthenticated {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kvindexd"`)
			}
			writeError(w, errorf(code, "%s", msg))
			return
		}
		if need == ScopeAdmin && hasBody(r) && !isJSON(r.Header.Get("Content-Type")) {
			writeErrorStatus(w, http.StatusUnsupportedMediaType, errorf(codes.InvalidArgument,
				"Content-Type %q: admin calls take application/json", r.Header.Get("Content-Type")))
			return
		}
		done := s.admitBody(w, r)
		if done == nil {
			return
		}
		defer done()
		next.ServeHTTP(w, r)
	})
}

func hasBody(r *http.Request) bool {
	return r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// GRPCServerOptions are the guard's interceptors (chained, so other
// interceptors may be added alongside).
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := s.grpcGuard(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := s.grpcGuard(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

func (s *Server) grpcGuard(ctx context.Context, method string) error {
	need := grpcScope(method)
	token := ""
	if s.cfg.Auth != nil && need != ScopeNone {
		// ValueFromIncomingContext reads one key without copying the
		// whole metadata map.
		if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
			token = bearer(v[0])
		}
	}
	if code, reason, msg := s.authorize(need, token); code != codes.OK {
		s.guardMetrics.denied.WithLabelValues("grpc", reason).Inc()
		return status.Error(code, msg)
	}
	return nil
}

// peerCall reports whether r asks for the peer copy with the peer token
// (Config.PeerToken), compared in constant time.
func (s *Server) peerCall(r *http.Request) bool {
	if s.cfg.PeerToken == "" || r.URL.Path != indexer.PeerSnapshotPath || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	got := sha256.Sum256([]byte(bearer(r.Header.Get("Authorization"))))
	want := sha256.Sum256([]byte(s.cfg.PeerToken))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}
