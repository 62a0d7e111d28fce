package indexer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// PromptTokenizer turns a /v1/completions prompt into the token ids vLLM
// would compute for it: TokenizePrompt with add_special_tokens as vLLM
// applies it, TokenizeRendered without special tokens (a prompt sent with
// add_special_tokens=false). The daemon passes the prefix store.
type PromptTokenizer interface {
	TokenizePrompt(ctx context.Context, model, prompt string) ([]uint32, error)
	TokenizeRendered(ctx context.Context, model, text string) ([]uint32, error)
}

// ChatTokenizer turns a chat request into the token ids vLLM's chat endpoint
// computes: the model's chat template, then tokenization with
// add_special_tokens=addSpecial (false unless the request says otherwise).
// A request with media yields the tokens before its first media item, with
// Unscored set. Errors that are the request's fault are
// *chattemplate.RequestError; any other error means this daemon cannot
// render for the model.
type ChatTokenizer interface {
	TokenizeChat(ctx context.Context, model string, req *chattemplate.Request, addSpecial bool) (chattemplate.Tokens, error)
}

// Config is everything the Indexer needs. Keys is required (at least its
// Algo and BlockSize); with the rest zero it is an in-memory index with
// default bounds and weights, no event subscriber (batches go to Sink) and
// no persistence. A zero tunable means its row's default in Options
// (options.go), except where the field says 0 is itself a setting;
// DefaultConfig fills them all and ValidateConfig checks their ranges.
type Config struct {
	// Keys is the default block-key config; ModelKeys overrides it per model
	// name (a model's engine may use another hash, seed or block size).
	Keys      blockkeys.KeyConfig
	ModelKeys map[string]blockkeys.KeyConfig
	// Index selects the built-in backend: in memory (default) or Redis.
	Index IndexConfig
	// Backend, when set, builds a custom backend instead (tests, embedding);
	// Index is then not used.
	Backend BackendFunc
	// TierWeights weighs matched blocks by storage tier; nil =
	// kvindex.DefaultTierWeights.
	TierWeights *kvindex.TierWeights
	// DigestCacheSize bounds the applier's per-model digest cache
	// (applier.Options.DigestCacheSize).
	DigestCacheSize int
	// ApplierLimits bound the applier's per-model and per-pod state (their
	// rows in applier.Options; the applier resolves the zero ones).
	ApplierLimits applier.Limits
	// KeyCacheSize bounds each key config's request-path key cache in blocks
	// (Options.KeyCacheSize; < 0 = no cache: hash every block).
	KeyCacheSize int
	// Tokenizer scores prompts; nil makes a prompt query FailedPrecondition.
	Tokenizer PromptTokenizer
	// Chat scores chat requests; nil makes a messages query
	// FailedPrecondition.
	Chat ChatTokenizer
	// Prediction samples scored requests to check that the blocks they
	// predict are later stored by the engines (see PredictionConfig).
	Prediction PredictionConfig
	// DynamoHashCapacity caps the table translating NVIDIA Dynamo's
	// LocalBlockHashes to engine hashes (dynamo.go; 0 = the
	// Options.DynamoHashCapacity default). The table fills only after
	// EnableDynamoHashes.
	DynamoHashCapacity int
	// Registry receives the applier's and the indexer's metrics; nil = a
	// private registry.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Pick configures Pick (policies, speculative entries, routing history).
	// With the Redis index, speculative entries are kept in Redis, shared
	// by every daemon on it.
	Pick PickConfig
	// Events, when set, subscribes to the engines' KV events (package
	// kvevents) and delivers them to Sink; Run runs the subscriber. nil:
	// batches reach the index only through Sink.
	Events *kvevents.Config
	// Persist saves the in-memory index to a file and restores it at start
	// (persist.go). Needs Events (a restored pod waits for its stream).
	Persist PersistConfig
	// Peers: a daemon that starts without a loaded snapshot fetches a live
	// peer's index instead (peer.go). Needs Events, like Persist.
	Peers PeerConfig
	// Leases divide the Events endpoints between the daemons sharing a
	// Redis index (leases.go).
	Leases LeaseConfig
	// StorageReaders names the storage sources (publishers whose topic's
	// pod slot is a storage medium, e.g. llm-d's SHARED_STORAGE) and the
	// pod names that can load their blocks; a nil list = every pod that
	// publishes for the same model, an empty one = none. Their blocks are
	// credited to the readers as event.TierShared and the sources are
	// never scored or picked (storage.go). nil = DefaultStorageReaders
	// (none): a batch whose topic names a StorageMedia entry that is not
	// configured here is refused.
	StorageReaders map[string][]string
	// Tracer makes the score and pick stage spans, the Redis round-trip
	// spans and the sampled event-batch spans (package internal/tracing);
	// nil = tracing off, which costs one pointer test per stage.
	Tracer *tracing.Tracer
}

// Indexer owns the wired parts. Every method is safe for concurrent use.
type Indexer struct {
	in      *kvindex.Interner
	hashers *blockkeys.HasherSet
	// keyCfg and modelKeyCfg are what hashers were built from (HashConfigID).
	keyCfg      blockkeys.KeyConfig
	modelKeyCfg map[string]blockkeys.KeyConfig
	keys        keyCaches
	idx         kvindex.Index
	backend     Backend
	applier     *applier.Applier
	scorer      *kvindex.Scorer
	tok         PromptTokenizer
	chat        ChatTokenizer
	// pred is nil when prediction sampling is off.
	pred *predictor
	// trusted is the candidate filter, held as a typed func so scoring
	// cannot lose it: it asks the subscriber, the one owner of whether a
	// pod may be served (kvevents.Subscriber.Servable: restored and not
	// resumed, or an index write failed and the pod is not cleared yet).
	// Without a subscriber every pod is served: whoever calls Sink's
	// Apply owns the outcomes it returns.
	trusted func(kvindex.PodID) bool
	// dyn translates Dynamo's LocalBlockHashes to engine hashes (dynamo.go).
	dyn  *dynTable
	pick *picker
	// quality counts what picks found and chose, and holds the picks
	// awaiting the engines' feedback (quality.go).
	quality *quality
	// podOrder ranks pod names for ordering answers (score.go).
	podOrder nameOrder
	storage  storageSources
	// storageLogAt is when the last refused storage claim was logged
	// (unix ns): one line per storageLogEvery.
	storageLogAt atomic.Int64
	m            *metrics
	// stages are the per-stage latency series (stages.go).
	stages *stageMetrics
	// tr is Config.Tracer (nil = off); batchSpans paces the event-batch
	// spans (trace.go).
	tr         *tracing.Tracer
	batchSpans batchSampler
	log        *slog.Logger
	// sub is the event subscriber (nil without Config.Events); persist and
	// leases are its features (nil when off).
	sub *kvevents.Subscriber
	// streams is sub for the score path (streams.go); nil without it.
	streams StreamStates
	persist *persistence
	leases  *leaseLoop
	// evictedMu guards evictedBuf, reportEvicted's reused buffer.
	evictedMu  sync.Mutex
	evictedBuf []kvindex.PodID
}

// New builds the interner, hashers, backend, scorer, applier and, when
// configured, the event subscriber with its persistence and leases. A
// feature whose backend lacks what it needs is an error here, never a
// silent off.
func New(ctx context.Context, cfg Config) (_ *Indexer, err error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
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
	hashers, err := blockkeys.NewHasherSet(cfg.Keys, cfg.ModelKeys)
	if err != nil {
		return nil, err
	}
	ix := &Indexer{in: kvindex.NewInterner(), hashers: hashers, keyCfg: cfg.Keys, modelKeyCfg: cfg.ModelKeys, tok: cfg.Tokenizer, chat: cfg.Chat, storage: newStorageSources(cfg.StorageReaders),
		keys: newKeyCaches(hashers, cfg.ModelKeys, cfg.KeyCacheSize), log: cfg.Logger, tr: cfg.Tracer}
	if ix.backend, err = buildBackend(ctx, cfg, ix.in, cfg.Logger); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = ix.Close()
		}
	}()
	ix.idx = ix.backend.Index
	ix.scorer = kvindex.NewScorer(ix.idx, ix.backend.Prefix, weights)
	applied, held := ix.idx, ix.backend.Held
	if cfg.Prediction.SampleRate > 0 {
		if ix.pred, err = newPredictor(cfg.Prediction, ix.in, cfg.Registry); err != nil {
			return nil, err
		}
		// The applier's writes pass the predictor, which sees every stored
		// key under the key the index keeps (after aliasing). The wrapper
		// wraps both ways of writing: Index.Add and the backend's Held.
		applied, held = observe(ix.idx, held, ix.pred)
	}
	if cfg.ApplierLimits.PodShare > 0 && ix.backend.Share == nil {
		return nil, errors.New("indexer: a pod share needs an index that accounts entries per pod (the in-memory " +
			"index); set it to 0 with this backend")
	}
	if ix.applier, err = applier.New(applier.Config{
		Index: applied, Interner: ix.in, Hashers: hashers, DigestCacheSize: cfg.DigestCacheSize,
		Metrics: applier.NewMetrics(cfg.Registry), Logger: cfg.Logger.With("component", "applier"),
		Limits: cfg.ApplierLimits, Share: ix.backend.Share, Held: held, Answered: ix.dropAnswered,
	}); err != nil {
		return nil, err
	}
	ix.trusted = ix.servable
	if ix.dyn, err = newDynTable(cfg.DynamoHashCapacity, cfg.Registry, ix.heldAnywhere); err != nil {
		return nil, err
	}
	if ix.pick, err = newPicker(cfg.Pick, ix.sharedSpeculative); err != nil {
		return nil, err
	}
	ix.quality = newQuality(ix.in, ix.pick.now, cfg.Logger.With("component", "quality"), cfg.Pick.FeedbackCapacity, cfg.Pick.FeedbackTTL)
	if ix.m, err = newMetrics(cfg.Registry, ix); err != nil {
		return nil, err
	}
	if ix.stages, err = newStageMetrics(cfg.Registry); err != nil {
		return nil, err
	}
	if err := ix.startEvents(cfg); err != nil {
		return nil, err
	}
	if ix.backend.Lost != nil {
		ix.backend.Lost(ix.indexLost)
	}
	return ix, nil
}

// Sink is where kvevents delivers decoded engine batches: the applier,
// followed by dropping the speculative entries the events answer. Apply's
// outcome is for the caller to record (kvevents does; an embedder feeding
// Sink directly owns it).
func (ix *Indexer) Sink() event.Sink { return eventSink{ix} }

// KeyConfig is the block-key config used for model.
func (ix *Indexer) KeyConfig(model string) blockkeys.KeyConfig { return ix.hashers.For(model).Config() }

// PodRanks is how many data-parallel ranks of the pod name have been seen.
func (ix *Indexer) PodRanks(name string) int { return len(ix.in.PodsNamed(name)) }

// CanBeUnavailable reports whether the backend has a health check (Redis);
// the in-memory index cannot fail.
func (ix *Indexer) CanBeUnavailable() bool { return ix.backend.Health != nil }

// Healthy runs the backend's health check; nil for a backend that cannot fail.
func (ix *Indexer) Healthy(ctx context.Context) error {
	if ix.backend.Health == nil {
		return nil
	}
	return ix.backend.Health.Healthy(ctx)
}

// Close releases the subscriber's sockets and the backend. Call it after
// Run has returned (or instead of Run).
func (ix *Indexer) Close() error {
	var errs []error
	if ix.sub != nil {
		errs = append(errs, ix.sub.Close())
	}
	if ix.backend.Close != nil {
		errs = append(errs, ix.backend.Close())
	}
	return errors.Join(errs...)
}
