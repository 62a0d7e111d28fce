// Package api is what routers call: the kvindex.v1.Indexer gRPC service, the
// llm-d compatible indexer.v1.IndexerService, grpc.health.v1 and reflection,
// and the HTTP/JSON surface registered in Handler (http.go): the status page
// at /, /v1/status, /v1/score, /v1/pick, /v1/feedback, Mooncake's /query and
// /query_by_hash (also in Dynamo's form), Dynamo's /register, /unregister,
// /workers, /dump, /register_peer, /deregister_peer, /peers and /health, /v1/pods, /v1/models, /v1/endpoints,
// /metrics, /healthz and /readyz (TestPackageDocNamesEveryRoute keeps this list whole). It is
// transport only: it decodes requests into
// indexer.Query values, encodes indexer.Result answers, maps indexer error
// codes to gRPC codes and HTTP statuses, and keeps request metrics and
// readiness. Hashing, lookup, the trust filter and DP-rank aggregation live
// in package indexer, which also owns every part of the index.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/bytebudget"
	"github.com/kvindex/kvindex/internal/grpcbuf"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	indexerv1 "github.com/kvindex/kvindex/proto/llmd/indexer/v1"
)

// Subscriber is the event subscriber's management surface
// (*kvevents.Subscriber).
type Subscriber interface {
	AddEndpoint(ep kvevents.EndpointConfig) error
	RemoveEndpoint(address string) error
	// RemoveEndpointPod removes one sharer of an address
	// (kvevents.EndpointConfig.Share), or the endpoint if it names pod.
	RemoveEndpointPod(address, pod string) error
	Endpoints() []kvevents.EndpointStatus
	Streams() []kvevents.StreamStats
	// ApplyStall is how long the longest-running current apply has been
	// running (kvevents.Subscriber.ApplyStall).
	ApplyStall() time.Duration
}

// DefaultApplyStallTimeout is the default Config.ApplyStallTimeout: far
// above what one batch takes to apply (the largest one a publisher may
// send, ~4M hashes, takes seconds), far below what a router should keep
// trusting a daemon whose index writes have stopped.
const DefaultApplyStallTimeout = 30 * time.Second

// Config wires the server to the daemon's parts.
type Config struct {
	// Indexer answers scores and pod listings (required).
	Indexer *indexer.Indexer
	// Subscriber provides stream statistics and endpoint management; nil
	// turns /v1/endpoints into 501 / Unimplemented.
	Subscriber Subscriber
	// Registry is the daemon's one Prometheus registry: the server registers
	// its metrics there and serves it on /metrics. nil = a private registry.
	Registry *prometheus.Registry
	Logger   *slog.Logger

	// Auth, when set, requires a bearer token on every call but the probes
	// (see guard.go); nil serves without authentication.
	Auth *Tokens
	// MetricsAuth requires a read token on /metrics too (with Auth).
	MetricsAuth bool
	// AdminAPI serves endpoint management (POST/DELETE /v1/endpoints,
	// AddEndpoint, RemoveEndpoint). It is also on when Auth holds an admin
	// token; otherwise those calls answer PermissionDenied / 403.
	AdminAPI bool
	// PeerToken (kvindexd --peer-token-file) is the token replicas send
	// each other for peer recovery: a caller presenting it may take GET
	// /v1/admin/snapshot, and nothing else, whether or not the admin API
	// or a token file is on. Replicas started alike then recover from each
	// other with one shared secret and no admin token in their token
	// files. "" = none.
	PeerToken string
	// Endpoints checks the addresses given to AddEndpoint; nil accepts any
	// tcp:// or ipc:// address with a host (DefaultEndpointPolicy).
	Endpoints *EndpointPolicy
	// MaxBodyBytes caps an HTTP request body (0 = no cap beyond each
	// handler's own).
	MaxBodyBytes int64
	// MaxPromptBytes is the prompt cap (--max-prompt-bytes): bodies are
	// capped at what the largest prompt needs (bodyCap; 0 = not derived).
	MaxPromptBytes int
	// BodyBudgetBytes bounds the request bodies over 1 MiB in progress
	// together (0 = DefaultBodyBudget).
	BodyBudgetBytes int64
	// ApplyStallTimeout makes the daemon not ready while an event worker
	// has been inside one apply (one batch written to the index, or one
	// pod forgotten) longer than this: the backend hangs and every pod on
	// that worker goes stale. It recovers by itself when the apply
	// returns. Only progress counts, never backlog: a pod flooding its
	// worker lags its own scores (apply_lag_seconds) but cannot make the
	// daemon unready. 0 = readiness ignores the apply path; it also needs
	// Subscriber.
	ApplyStallTimeout time.Duration
	// MaxRegistrations caps the workers registered through Dynamo's POST
	// /register (0 = DefaultMaxRegistrations; kvindexd passes --max-streams).
	MaxRegistrations int
	// Peers seeds Dynamo's peer registry (GET /peers): kvindexd's --peers.
	Peers []string
	// MaxTenants caps the tenants besides the default holding Dynamo
	// registrations (0 = Options.MaxTenants' default; --max-tenants).
	MaxTenants int
	// Tracer makes the request spans of Score and Pick (HTTP and gRPC)
	// with the caller's W3C trace context as parent; nil = tracing off.
	// The indexer's stage spans come from its own Config.Tracer (the
	// daemon passes the same one).
	Tracer *tracing.Tracer
	// Build identifies the running binary: GET /v1/status reports it and
	// the kvindexd_build_info gauge carries it as labels, so a dashboard
	// can tell which version each replica runs.
	Build BuildInfo
}

// BuildInfo is the version, VCS commit and Go version of the binary.
type BuildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
}

// Server implements both gRPC services and the HTTP handler.
type Server struct {
	kvindexv1.UnimplementedIndexerServer
	// hdrBudget is the header budget HTTP and gRPC share (headerBudgetFor).
	hdrOnce   sync.Once
	hdrBudget *headerBudget
	cfg       Config
	idx       *indexer.Indexer
	log       *slog.Logger
	metrics   *metrics
	// pickMetrics are the Pick request series (both transports).
	pickMetrics *pickMetrics

	healthSrv *health.Server
	ready     atomic.Bool
	readyErr  atomic.Pointer[string]
	// stopping wins over ready: a health check still running when Shutdown
	// is called must not report ready again while requests drain.
	stopping     atomic.Bool
	llmd         llmdService
	guardMetrics *guardMetrics
	// dynReg and dynamo: Dynamo's /register registry and its series
	// (dynamo.go).
	dynReg dynRegistry
	// dynPeers is Dynamo's peer registry (dynamo_peers.go).
	dynPeers *dynPeers
	// dumping is set while a GET /dump streams (one at a time).
	dumping atomic.Bool
	dynamo  *dynamoMetrics
	tr      *tracing.Tracer
	// bodies is the request body budget (bodybudget.go).
	bodies *bytebudget.Budget
	// peerCopy admits one peer copy at a time (peer.go); peerCopies counts them.
	peerCopy   chan struct{}
	peerCopies *prometheus.CounterVec
}

// New checks the config and registers the metrics.
func New(cfg Config) (*Server, error) {
	if cfg.Indexer == nil {
		return nil, errors.New("api: Indexer is required")
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, idx: cfg.Indexer, log: cfg.Logger, healthSrv: health.NewServer(), tr: cfg.Tracer}
	s.llmd.server = s
	m, err := newMetrics(cfg.Registry, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	if s.pickMetrics, err = newPickMetrics(cfg.Registry); err != nil {
		return nil, err
	}
	if s.guardMetrics, err = newGuardMetrics(cfg.Registry); err != nil {
		return nil, err
	}
	if s.dynPeers, err = newDynPeers(cfg.Registry, cfg.Peers); err != nil {
		return nil, err
	}
	if s.dynamo, err = newDynamoMetrics(cfg.Registry, &s.dynReg); err != nil {
		return nil, err
	}
	s.bodies = s.newBodyBudget()
	if err := registerBuildInfo(cfg.Registry, cfg.Build); err != nil {
		return nil, err
	}
	s.peerCopy = make(chan struct{}, 1)
	s.peerCopies = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindexd_peer_copies_served_total",
		Help: "Copies of the index asked for by a peer starting empty (GET /v1/admin/snapshot), by result (ok, hash_config: refused, the peer keys blocks otherwise, busy: another copy was streaming, error: interrupted)."},
		[]string{"result"})
	for _, r := range []string{"ok", "hash_config", "busy", "error"} {
		s.peerCopies.WithLabelValues(r)
	}
	if err := cfg.Registry.Register(s.peerCopies); err != nil {
		return nil, err
	}
	// Until the first health check ran, an index that can fail is not ready.
	canFail := s.idx.CanBeUnavailable()
	s.ready.Store(!canFail)
	s.setServing(!canFail)
	return s, nil
}

// RegisterGRPC adds kvindex.v1.Indexer, indexer.v1.IndexerService,
// grpc.health.v1 and reflection to gs.
func (s *Server) RegisterGRPC(gs *grpc.Server) {
	kvindexv1.RegisterIndexerServer(gs, s)
	indexerv1.RegisterIndexerServiceServer(gs, &s.llmd)
	healthpb.RegisterHealthServer(gs, s.healthSrv)
	reflection.Register(gs)
}

// NewGRPCServer returns a grpc.Server with every service registered behind
// the access guard (GRPCServerOptions).
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	// Finer buffer tiers than grpc-go's, in the transport and the codec
	// (internal/grpcbuf): an 8k-token request would otherwise zero a 1 MiB
	// buffer.
	base := append(s.GRPCServerOptions(), experimental.BufferPool(grpcbuf.Pool), grpc.ForceServerCodecV2(grpcbuf.Codec))
	gs := grpc.NewServer(append(base, opts...)...)
	s.RegisterGRPC(gs)
	return gs
}

// Shutdown marks every service NOT_SERVING so load balancers drain first.
func (s *Server) Shutdown() {
	s.stopping.Store(true)
	s.ready.Store(false)
	s.healthSrv.Shutdown() // also ignores later SetServingStatus calls
}

// CheckHealth runs the index health check and the apply path check once
// and publishes the result to /readyz and grpc.health.v1.
func (s *Server) CheckHealth(ctx context.Context) error {
	if !s.checksHealth() {
		return nil
	}
	var why *notReady
	if s.idx.CanBeUnavailable() {
		if err := s.idx.Healthy(ctx); err != nil {
			why = &notReady{cause: "index unhealthy", err: err}
		}
	}
	if why == nil {
		why = s.applyStalled()
	}
	ok := why == nil
	var prev *string
	if ok {
		prev = s.readyErr.Swap(nil)
	} else {
		msg := why.Error()
		prev = s.readyErr.Swap(&msg)
	}
	if s.ready.Swap(ok) != ok {
		switch {
		case !ok:
			s.log.Warn(why.cause+": not ready", "err", why.err)
		case prev != nil && strings.HasPrefix(*prev, applyStalledCause):
			s.log.Info("apply path moving again: ready")
		default:
			s.log.Info("index healthy: ready")
		}
	}
	s.setServing(ok)
	if !ok {
		return why
	}
	return nil
}

// notReady is why a health check failed: its cause leads the reason /readyz
// gives and the log line.
type notReady struct {
	cause string
	err   error
}

func (e *notReady) Error() string { return e.cause + ": " + e.err.Error() }
func (e *notReady) Unwrap() error { return e.err }

const applyStalledCause = "apply path stalled"

// applyStalled is the apply path check (Config.ApplyStallTimeout).
func (s *Server) applyStalled() *notReady {
	if !s.checksApply() {
		return nil
	}
	if d := s.cfg.Subscriber.ApplyStall(); d > s.cfg.ApplyStallTimeout {
		return &notReady{cause: applyStalledCause, err: fmt.Errorf("an event worker has been inside one index write for %v "+
			"(bound %v): the index backend is not answering", d.Round(time.Millisecond), s.cfg.ApplyStallTimeout)}
	}
	return nil
}

func (s *Server) checksApply() bool { return s.cfg.ApplyStallTimeout > 0 && s.cfg.Subscriber != nil }

// checksHealth: something can make the daemon not ready besides shutdown.
func (s *Server) checksHealth() bool { return s.idx.CanBeUnavailable() || s.checksApply() }

// WatchHealth calls CheckHealth every interval until ctx is done.
func (s *Server) WatchHealth(ctx context.Context, interval time.Duration) {
	if !s.checksHealth() {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, interval)
		_ = s.CheckHealth(cctx)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Ready reports whether the daemon should receive traffic, with the reason
// when it should not.
func (s *Server) Ready() (bool, string) {
	if s.stopping.Load() {
		return false, "shutting down"
	}
	if s.ready.Load() {
		return true, ""
	}
	if p := s.readyErr.Load(); p != nil {
		return false, *p
	}
	return false, "index health not checked yet"
}

func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", kvindexv1.Indexer_ServiceDesc.ServiceName, indexerv1.IndexerService_ServiceDesc.ServiceName} {
		s.healthSrv.SetServingStatus(name, st)
	}
}
