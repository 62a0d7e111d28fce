package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/redact"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/discovery"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization"
	"github.com/kvindex/kvindex/tokenization/chatprompt"
)

// shutdownGrace bounds how long in-flight requests may finish on shutdown.
const shutdownGrace = 5 * time.Second

// grpcHandshakeTimeout bounds a new gRPC connection's handshake (TLS and
// HTTP/2 preface): a client that connects and stays silent is dropped.
const grpcHandshakeTimeout = 10 * time.Second

// daemon is the wired process: one registry, the indexer (which owns the
// interner, index, applier and scorer), the subscriber feeding the indexer's
// sink, and the API in front of it all.
type daemon struct {
	cfg Config
	log *slog.Logger
	reg *prometheus.Registry

	// idx is the composition root: index, applier, scorer, event
	// subscriber and its features (snapshots, leases).
	idx *indexer.Indexer
	api *api.Server
	// discovery, when set, subscribes to the engine pods Kubernetes lists.
	discovery *discovery.Discoverer

	grpcLn, httpLn net.Listener
	grpcSrv        *grpc.Server
	httpSrv        *http.Server
	closers        []func() error
	sec            *security
	// tr is the OpenTelemetry tracer the OTEL_* environment configures;
	// nil = tracing off (the default). The indexer and the API get it
	// explicitly.
	tr *tracing.Tracer
}

// setupTracing builds the tracer from the standard OTEL_* environment
// variables only (internal/tracing.Config says which and what they mean).
func (d *daemon) setupTracing(ctx context.Context) error {
	tr, st, err := tracing.FromEnv(ctx, os.Getenv, buildInfo().Version)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	if tr == nil {
		return nil
	}
	// The SDK reports export failures (collector down) through this one
	// process-wide handler; they go to the daemon's log, redacted.
	log := d.log
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	d.tr = tr
	d.closers = append(d.closers, func() error {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		return tr.Shutdown(sctx)
	})
	d.log.Info("tracing on", "exporter", st.Exporter, "protocol", st.Protocol, "sampler", st.Sampler)
	return nil
}

// newDaemon builds every part and opens the listeners (so their addresses
// are known before Run, which tests rely on with port 0).
func newDaemon(ctx context.Context, cfg Config, log *slog.Logger) (_ *daemon, err error) {
	// d is not the named result: `return nil, err` must not nil it before
	// the deferred close releases what was opened so far.
	// Every line the daemon and its libraries log goes through redaction:
	// URLs with credentials (--index, endpoints) never reach the log.
	log = redact.Logger(log)
	d := &daemon{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Tracing first: its closer runs last, after the servers stopped, so
	// the spans of the last requests are flushed.
	if err := d.setupTracing(ctx); err != nil {
		return nil, err
	}

	def, perModel, err := cfg.keyConfigs()
	if err != nil {
		return nil, err
	}
	weights, err := parseTierWeights(cfg.TierWeights)
	if err != nil {
		return nil, err
	}
	storage, err := parseStorageReaders(cfg.StorageReaders)
	if err != nil {
		return nil, err
	}
	index, err := redisindex.ParseIndexFlag(cfg.Index)
	if err != nil {
		return nil, err
	}
	idxCfg := indexer.IndexConfig{Capacity: cfg.Capacity}
	if !index.Memory {
		idxCfg.Redis = &index.Redis
	}
	pick, err := cfg.pickConfig()
	if err != nil {
		return nil, err
	}
	prompts, chats, err := d.tokenizers()
	if err != nil {
		return nil, err
	}
	if d.sec, err = buildSecurity(ctx, cfg, d.reg, log); err != nil {
		return nil, err
	}
	events := cfg.eventsConfig()
	leases, err := cfg.leaseConfig()
	if err != nil {
		return nil, err
	}
	peers, err := cfg.peerConfig()
	if err != nil {
		return nil, err
	}
	peers.URLs = append(slices.Clip(peers.URLs), cfg.discoverPeers(ctx, log)...)
	d.idx, err = indexer.New(ctx, indexer.Config{
		Keys: def, ModelKeys: perModel, Index: idxCfg, TierWeights: &weights,
		DigestCacheSize: cfg.DigestCacheSize, KeyCacheSize: cfg.KeyCacheSize, Tokenizer: prompts, Chat: chats, Prediction: cfg.predictionConfig(),
		ApplierLimits: cfg.LimitsConfig.applier(index.Memory), Registry: d.reg, Logger: log, Pick: pick,
		Events: &events, Persist: cfg.persistConfig(), Peers: peers, Leases: leases, StorageReaders: storage, Tracer: d.tr,
		DynamoHashCapacity: cfg.DynamoHashCapacity,
	})
	if err != nil {
		return nil, err
	}
	// The bind socket is open from here on: a failure below must release it.
	d.closers = append(d.closers, d.idx.Close)
	if cfg.Discovery.Enabled {
		if err := d.setupDiscovery(); err != nil {
			return nil, err
		}
	}

	d.api, err = api.New(api.Config{
		Indexer: d.idx, Subscriber: d.idx.Subscriber(), Registry: d.reg, Logger: log.With("component", "api"),
		Auth: d.sec.tokens, MetricsAuth: cfg.MetricsAuth, AdminAPI: cfg.AdminAPI, PeerToken: peers.Token, Endpoints: d.sec.policy,
		MaxBodyBytes: cfg.HTTPMaxBodyBytes, MaxPromptBytes: cfg.MaxPromptBytes, BodyBudgetBytes: cfg.HTTPBodyBudgetBytes, Build: buildInfo(), ApplyStallTimeout: time.Duration(cfg.ApplyStallTimeout),
		MaxRegistrations: cfg.MaxStreams, MaxTenants: cfg.MaxTenants, Peers: cfg.Peers,
		Tracer: d.tr,
	})
	if err != nil {
		return nil, err
	}
	if cfg.GRPCAddr != "" {
		if d.grpcLn, err = api.Listen(cfg.GRPCAddr); err != nil {
			return nil, fmt.Errorf("--grpc-addr: %w", err)
		}
		d.grpcLn = api.LimitListener(d.grpcLn, cfg.GRPCMaxConns, "grpc", d.sec.conns)
		// A 1M-token request is ~5 MB of protobuf: above gRPC's 4 MB default;
		// the cap is what the largest prompt needs (api.GRPCMaxRecvMsgSize).
		// Idle connections give their slot back, as on HTTP: without it
		// --grpc-max-conns connections that finished the HTTP/2 preface
		// and went quiet would lock every client out.
		// At the cap, an idle connection gives way to a new one
		// (api.LimitListener): the stats handler tells it which are idle.
		// Headers are capped as on HTTP (gRPC's own default is 16 MB), and
		// count in HTTP's header budget while they are read, decoded and
		// their call runs (api.GRPCHeaderBudget). Calls per connection are
		// capped (gRPC's default is unlimited: a goroutine per stream).
		opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(d.api.GRPCMaxRecvMsgSize()), grpc.ConnectionTimeout(grpcHandshakeTimeout),
			grpc.MaxConcurrentStreams(uint32(cfg.GRPCMaxStreams)),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: time.Duration(cfg.GRPCIdleTimeout)}),
			api.GRPCConnTracking(), grpc.MaxHeaderListSize(uint32(api.EffectiveHTTPLimits(cfg.httpLimits()).MaxHeaderBytes))}
		var creds credentials.TransportCredentials
		if d.sec.grpcTLS != nil {
			creds = credentials.NewTLS(d.sec.grpcTLS.ServerConfig("h2"))
		}
		opts = append(opts, d.api.GRPCHeaderBudget(cfg.httpLimits(), creds)...)
		d.grpcSrv = d.api.NewGRPCServer(opts...)
	}
	if cfg.HTTPAddr != "" {
		if d.httpLn, err = api.Listen(cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("--http-addr: %w", err)
		}
		d.httpLn = api.LimitListener(d.httpLn, cfg.HTTPMaxConns, "http", d.sec.conns)
		d.httpSrv = d.api.NewHTTPServer(cfg.httpLimits())
		// net/http's own messages (TLS handshake failures of scanners,
		// timeouts) go through the redacting logger, at debug level.
		d.httpSrv.ErrorLog = slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelDebug)
		if d.sec.httpTLS != nil {
			d.httpSrv.TLSConfig = d.sec.httpTLS.ServerConfig("h2", "http/1.1")
		}
	}
	return d, nil
}

// tokenizers returns the prefix store over the tokenizer registry (prompts)
// and the chat renderer over the same registry and store (chats), so a chat
// is rendered with the template of the very directory its tokenizer comes
// from. Both are always on: a model with no tokenizer or template is an
// error to the caller that names where the daemon looked, never an empty
// score.
func (d *daemon) tokenizers() (*prefixstore.Store, *chatprompt.Renderer, error) {
	models := map[string]string{}
	templates := map[string]string{}
	for name, m := range d.cfg.Models {
		if m.Tokenizer != "" {
			models[name] = m.Tokenizer
		}
		if m.ChatTemplate != "" {
			templates[name] = m.ChatTemplate
		}
	}
	for name, path := range d.cfg.Tokenizers {
		models[name] = path
	}
	reg := tokenization.NewRegistry(tokenization.RegistryConfig{Models: models, HFCacheDir: d.cfg.HFCacheDir, Dirs: d.cfg.TokenizersDir})
	store := prefixstore.New(prefixstore.Config{ChunkBytes: d.cfg.PrefixChunkBytes, Capacity: d.cfg.PrefixCapacity,
		MaxPromptBytes: d.cfg.MaxPromptBytes, MaxInflightBytes: d.cfg.TokenizeMaxInflightBytes}, reg,
		prefixstore.NewMetrics(d.reg))
	chats, err := chatprompt.New(chatprompt.Config{Registry: reg, Tokenizer: store, Templates: templates, Registerer: d.reg})
	if err != nil {
		return nil, nil, err
	}
	return store, chats, nil
}

func (e EndpointSpec) kvevents() kvevents.EndpointConfig {
	eng, _ := blockkeys.ParseEngine(e.Engine)
	return kvevents.EndpointConfig{Address: e.Address, Pod: e.Pod, Model: e.Model, Engine: eng, ReplayAddress: e.Replay,
		SnapshotAddress: e.Snapshot, Role: e.Role}
}

// eventsConfig is the subscriber's configuration: the bind socket, the
// endpoints, the queues and the limits.
func (cfg Config) eventsConfig() kvevents.Config {
	bindEngine, _ := blockkeys.ParseEngine(cfg.BindEngine)
	c := kvevents.Config{Bind: cfg.ZMQBind, BindEngine: bindEngine, BindFirstSeq: uint64(cfg.BindFirstSeq), TopicFilter: cfg.TopicFilter,
		AllTopics: cfg.AllTopics, Workers: cfg.Workers, QueueSize: cfg.QueueSize}
	cfg.LimitsConfig.subscriber(&c)
	for _, ep := range cfg.Endpoints {
		c.Endpoints = append(c.Endpoints, ep.kvevents())
	}
	return c
}

// leaseConfig is --leases, --lease-ttl and --daemon-id.
func (cfg Config) leaseConfig() (indexer.LeaseConfig, error) {
	if !cfg.Leases {
		return indexer.LeaseConfig{}, nil
	}
	return indexer.LeaseConfig{Enabled: true, TTL: time.Duration(cfg.LeaseTTL), DaemonID: cfg.DaemonID}, nil // validated
}

// GRPCAddr and HTTPAddr are the bound addresses ("" when off).
func (d *daemon) GRPCAddr() string {
	if d.grpcLn == nil {
		return ""
	}
	return d.grpcLn.Addr().String()
}

func (d *daemon) HTTPAddr() string {
	if d.httpLn == nil {
		return ""
	}
	return d.httpLn.Addr().String()
}

// Run serves until ctx is done, then shuts down gracefully: health goes
// NOT_SERVING, in-flight requests finish (bounded), the subscriber stops,
// the index closes.
func (d *daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	fail := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			errc <- fmt.Errorf("%s: %w", what, err)
			cancel()
		}
	}

	if err := d.api.CheckHealth(ctx); err != nil {
		d.log.Warn("index not healthy at start; serving not-ready and retrying", "err", err)
	}
	wg.Go(func() { d.api.WatchHealth(ctx, time.Second) })
	// The indexer's background work (events, leases, snapshots, recovery)
	// orders its own shutdown when ctx ends; Run waits for it below, after
	// the API has stopped taking requests.
	idxDone := make(chan struct{})
	go func() { defer close(idxDone); fail("indexer", d.idx.Run(ctx)) }()
	if d.discovery != nil {
		wg.Go(func() { fail("discovery", d.discovery.Run(ctx)) })
	}
	if d.grpcSrv != nil {
		wg.Go(func() { fail("grpc", d.grpcSrv.Serve(d.grpcLn)) })
		d.log.Info("gRPC listening", "addr", d.GRPCAddr())
	}
	if d.sec.tokens != nil {
		wg.Go(func() { d.sec.tokens.Watch(ctx, tokenReloadEvery) })
	}
	if d.httpSrv != nil {
		wg.Go(func() {
			serve := d.httpSrv.Serve
			if d.httpSrv.TLSConfig != nil {
				serve = func(ln net.Listener) error { return d.httpSrv.ServeTLS(ln, "", "") }
			}
			if err := serve(d.httpLn); !errors.Is(err, http.ErrServerClosed) {
				fail("http", err)
			}
		})
		d.log.Info("HTTP listening", "addr", d.HTTPAddr())
	}
	if w := seedWarning(d.cfg.HashAlgo, d.cfg.HashSeed); w != "" {
		d.log.Warn(w)
	}
	d.log.Info("kvindexd running", "zmq_bind", d.cfg.ZMQBind, "endpoints", len(d.cfg.Endpoints),
		"hash_algo", d.cfg.HashAlgo, "block_size", d.cfg.BlockSize, "index", redactIndex(d.cfg.Index))

	<-ctx.Done()
	d.log.Info("shutting down")
	d.api.Shutdown()
	sctx, scancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer scancel()
	if d.httpSrv != nil {
		_ = d.httpSrv.Shutdown(sctx)
	}
	if d.grpcSrv != nil {
		done := make(chan struct{})
		go func() { d.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-sctx.Done():
			d.grpcSrv.Stop()
		}
	}
	wg.Wait()
	<-idxDone
	d.close()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (d *daemon) close() {
	// After Serve the servers closed them already; before (a failed start)
	// nobody did. A second Close is harmless.
	if d.grpcLn != nil {
		_ = d.grpcLn.Close()
	}
	if d.httpLn != nil {
		_ = d.httpLn.Close()
	}
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			d.log.Warn("close", "err", err)
		}
	}
	d.closers = nil
}

// redactIndex hides a password in the --index URL for logs.
func redactIndex(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return s
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func newLogger(cfg Config, w io.Writer) (*slog.Logger, error) {
	level, err := parseLogLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// seedWarning is what the daemon says at start about its seed, or "" when
// the seed is one engines reproduce: vLLM derives NONE_HASH from
// PYTHONHASHSEED when set; unset, from blockkeys.DefaultSeed for the sha256
// family (since vllm-project/vllm PR #51875) and from random bytes for the
// xxhash family (and, before that PR, for every algorithm).
func seedWarning(algo, seed string) string {
	if seed != blockkeys.DefaultSeed {
		return "" // set on purpose: it must equal the engines' PYTHONHASHSEED
	}
	if blockkeys.HashAlgo(algo).RandomSeed() {
		return fmt.Sprintf("--hash-algo %s with the default --hash-seed: vLLM seeds %s with random bytes when PYTHONHASHSEED "+
			"is unset, which no indexer can reproduce; start every engine with PYTHONHASHSEED=0 and this daemon with "+
			"--hash-seed 0 (or KVINDEX_HASH_SEED, or hash_seed in the config file; any value both sides share)", algo, algo)
	}
	return ""
}
