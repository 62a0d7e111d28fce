package indexer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/chattemplate"
	"github.com/kvindex/kvindex/kvindex"
)

// PromptTokenizer turns a /v1/completions prompt into the token ids vLLM
// would compute for it (add_special_tokens as vLLM applies it). The daemon
// passes the prefix store.
type PromptTokenizer interface {
	TokenizePrompt(ctx context.Context, model, prompt string) ([]uint32, error)
}

// RenderedTokenizer is a PromptTokenizer that can also tokenize without
// special tokens (a prompt sent with add_special_tokens=false). The prefix
// store implements it.
type RenderedTokenizer interface {
	TokenizeRendered(ctx context.Context, model, text string) ([]uint32, error)
}

// ChatTokenizer turns a chat request into the token ids vLLM's chat endpoint
// computes: the model's chat template, then tokenization with
// add_special_tokens=addSpecial (false unless the request says otherwise).
// Errors that are the request's fault are *chattemplate.RequestError; any
// other error means this daemon cannot render for the model.
type ChatTokenizer interface {
	TokenizeChat(ctx context.Context, model string, req *chattemplate.Request, addSpecial bool) ([]uint32, error)
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
	// ApplierLimits bound the applier's per-model and per-pod state.
	ApplierLimits kvindex.ApplierLimits
	// KeyCacheSize bounds each key config's request-path key cache in blocks
	// (0 = kvindex.DefaultKeyCacheSize, < 0 = no cache: hash every block).
	KeyCacheSize int
	// Tokenizer scores prompts; nil makes a prompt query FailedPrecondition.
	Tokenizer PromptTokenizer
	// Chat scores chat requests; nil makes a messages query
	// FailedPrecondition.
	Chat ChatTokenizer
	// Prediction samples scored requests to check that the blocks they
	// predict are later stored by the engines (see PredictionConfig).
	Prediction PredictionConfig
	// Registry receives the applier's and the indexer's metrics; nil = a
	// private registry.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Pick configures Pick (policies, speculative entries, routing history).
	Pick PickConfig
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
	chat    ChatTokenizer
	// pred is nil when prediction sampling is off.
	pred *predictor
	// health is the backend's check; nil when the backend cannot fail.
	health kvindex.HealthChecker
	// names is the backend's shared-name lookup; nil for a process-local
	// index (see sharedNames in score.go).
	names kvindex.SharedNames
	// trusted is the applier's candidate filter, held as a typed func so
	// scoring cannot lose it: a pod is untrusted from an index write failure
	// until it has been cleared, and its entries are not served meanwhile.
	trusted func(kvindex.PodID) bool
	pick    *picker
	m       *metrics
	// gate holds back pods loaded from a snapshot (restore.go).
	gate restoreGate
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
	x := &Indexer{in: kvindex.NewInterner(), hashers: hashers, tok: cfg.Tokenizer, chat: cfg.Chat,
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
	if sn, ok := x.idx.(kvindex.SharedNames); ok {
		x.names = sn
	}
	x.scorer = kvindex.NewScorer(x.idx, weights)
	applied := x.idx
	if cfg.Prediction.SampleRate > 0 {
		if x.pred, err = newPredictor(cfg.Prediction, x.in, cfg.Registry); err != nil {
			_ = x.Close()
			return nil, err
		}
		// The applier's writes pass the predictor, which sees every stored
		// key under the key the index keeps (after aliasing).
		applied = observedIndex{Index: x.idx, p: x.pred}
	}
	x.applier = kvindex.NewApplier(kvindex.ApplierConfig{
		Index: applied, Interner: x.in, Hashers: hashers, DigestCacheSize: cfg.DigestCacheSize,
		Metrics: kvindex.NewMetrics(cfg.Registry), Logger: cfg.Logger.With("component", "applier"),
		Limits: cfg.ApplierLimits,
	})
	x.trusted = func(p kvindex.PodID) bool { return x.applier.Trusted(p) && !x.gate.stale(p) }
	if x.pick, err = newPicker(cfg.Pick, x.idx); err != nil {
		_ = x.Close()
		return nil, err
	}
	if x.m, err = newMetrics(cfg.Registry, x); err != nil {
		_ = x.Close()
		return nil, err
	}
	return x, nil
}

// Sink is where kvevents delivers decoded engine batches: the applier,
// behind the gate of pods restored from a snapshot, followed by dropping the
// speculative entries the events answer.
func (x *Indexer) Sink() kvindex.BatchSink { return gatedSink{x} }

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
