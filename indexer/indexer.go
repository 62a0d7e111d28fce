package indexer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/kvindex"
)

// PromptTokenizer turns a /v1/completions prompt into the token ids vLLM
// would compute for it (add_special_tokens as vLLM applies it). The daemon
// passes the prefix store.
type PromptTokenizer interface {
	TokenizePrompt(ctx context.Context, model, prompt string) ([]uint32, error)
}

// BackendFunc builds the index backend on the interner the Indexer owns. It
// is a factory, not an Index, so that a backend that stores pod and model
// names (Redis) can only ever be given the interner every other part uses.
// A backend holding resources implements io.Closer; Indexer.Close closes it.
type BackendFunc func(ctx context.Context, in *kvindex.Interner) (kvindex.Index, error)

// Config is everything the Indexer needs; the zero value (plus Keys) is an
// in-memory index with default bounds and weights.
type Config struct {
	// Keys is the default block-key config; ModelKeys overrides it per model
	// name (a model's engine may use another hash, seed or block size).
	Keys      kvindex.KeyConfig
	ModelKeys map[string]kvindex.KeyConfig
	// Backend builds the index; nil = kvindex.MemoryIndex bounded by Capacity.
	Backend BackendFunc
	// Capacity bounds the in-memory index in (block, pod) entries (0 =
	// default). Ignored with a Backend.
	Capacity int64
	// TierWeights weighs matched blocks by storage tier; nil =
	// kvindex.DefaultTierWeights.
	TierWeights *kvindex.TierWeights
	// DigestCacheSize bounds the applier's per-model digest cache (0 = default).
	DigestCacheSize int
	// KeyCacheSize bounds each key config's request-path key cache in blocks
	// (0 = kvindex.DefaultKeyCacheSize, < 0 = no cache: hash every block).
	KeyCacheSize int
	// Tokenizer scores prompts; nil makes a prompt query FailedPrecondition.
	Tokenizer PromptTokenizer
	// Registry receives the applier's and the indexer's metrics; nil = a
	// private registry.
	Registry *prometheus.Registry
	Logger   *slog.Logger
}

// Indexer owns the wired parts. Every method is safe for concurrent use.
type Indexer struct {
	in      *kvindex.Interner
	hashers *kvindex.HasherSet
	keys    keyCaches
	idx     kvindex.Index
	applier *kvindex.Applier
	scorer  *kvindex.Scorer
	tok     PromptTokenizer
	// health is the backend's check; nil when the backend cannot fail.
	health kvindex.HealthChecker
	// trusted is the applier's candidate filter, held as a typed func so
	// scoring cannot lose it: a pod is untrusted from an index write failure
	// until it has been cleared, and its entries are not served meanwhile.
	trusted func(kvindex.PodID) bool
	m       *metrics
}

// New builds the interner, hashers, backend, scorer and applier.
func New(ctx context.Context, cfg Config) (*Indexer, error) {
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	weights := kvindex.DefaultTierWeights()
	if cfg.TierWeights != nil {
		weights = *cfg.TierWeights
	}
	hashers, err := kvindex.NewHasherSet(cfg.Keys, cfg.ModelKeys)
	if err != nil {
		return nil, err
	}
	x := &Indexer{in: kvindex.NewInterner(), hashers: hashers, tok: cfg.Tokenizer,
		keys: newKeyCaches(hashers, cfg.ModelKeys, cfg.KeyCacheSize)}
	if cfg.Backend == nil {
		x.idx = kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: cfg.Capacity})
	} else {
		if x.idx, err = cfg.Backend(ctx, x.in); err != nil {
			return nil, err
		}
		if x.idx == nil {
			return nil, errors.New("indexer: backend factory returned no index")
		}
	}
	if hc, ok := x.idx.(kvindex.HealthChecker); ok {
		x.health = hc
	}
	x.scorer = kvindex.NewScorer(x.idx, weights)
	x.applier = kvindex.NewApplier(kvindex.ApplierConfig{
		Index: x.idx, Interner: x.in, Hashers: hashers, DigestCacheSize: cfg.DigestCacheSize,
		Metrics: kvindex.NewMetrics(cfg.Registry), Logger: cfg.Logger.With("component", "applier"),
	})
	x.trusted = x.applier.Trusted
	if x.m, err = newMetrics(cfg.Registry, x); err != nil {
		_ = x.Close()
		return nil, err
	}
	return x, nil
}

// Sink is where kvevents delivers decoded engine batches (the applier).
func (x *Indexer) Sink() kvindex.BatchSink { return x.applier }

// KeyConfig is the block-key config used for model.
func (x *Indexer) KeyConfig(model string) kvindex.KeyConfig { return x.hashers.For(model).Config() }

// PodRanks is how many data-parallel ranks of the pod name have been seen.
func (x *Indexer) PodRanks(name string) int { return len(x.in.PodsNamed(name)) }

// CanBeUnavailable reports whether the backend has a health check (Redis);
// the in-memory index cannot fail.
func (x *Indexer) CanBeUnavailable() bool { return x.health != nil }

// Healthy runs the backend's health check; nil for a backend that cannot fail.
func (x *Indexer) Healthy(ctx context.Context) error {
	if x.health == nil {
		return nil
	}
	return x.health.Healthy(ctx)
}

// RunRecovery clears pods marked untrusted by an index error once the index
// is back, every interval until ctx is done, even if they publish nothing
// more (the applier clears a pod that does publish before its next batch).
func (x *Indexer) RunRecovery(ctx context.Context, interval time.Duration) {
	x.applier.RunRecovery(ctx, interval)
}

// Close releases the backend when it holds resources (io.Closer).
func (x *Indexer) Close() error {
	if c, ok := x.idx.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
