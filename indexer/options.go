package indexer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvindex"
)

// Options is the one declaration of the tunables the indexer owns (block
// keys, the request-path key cache, Pick's speculation and history,
// prediction, leases, snapshots): each row's default, range and help.
// DefaultConfig, ValidateConfig, New's reading of a zero field and
// kvindexd's flags (and so docs/configuration.md) all read it. The parts it
// builds keep their own tables (applier.Options,
// kvindex.MemoryOptions, kvevents.Options) and resolve their own zero
// fields.
//
// What 0 means in Config: the row's default, read in withDefaults and
// nowhere else; except where 0 is itself a setting, said at the field
// (Prediction.SampleRate: off; Persist.MaxAge: no bound;
// ApplierLimits.PodShare: no per-pod bound). DefaultConfig fills every field.
var Options = struct {
	BlockSize, KeyCacheSize                    option.Int
	SpeculativeTTL, HistoryTTL                 option.Duration
	SpeculativeCapacity, HistoryCapacity       option.Int
	PDMaxLocalPrefillTokens, PDMaxPrefillWait  option.Int
	PredictionSampleRate                       option.Float
	PredictionWindow                           option.Duration
	PredictionCapacity                         option.Int
	LeaseTTL, SnapshotInterval, SnapshotMaxAge option.Duration
	PeerMaxBytes                               option.Int
	PeerTimeout                                option.Duration
	FeedbackCapacity                           option.Int
	FeedbackTTL                                option.Duration
	DynamoHashCapacity                         option.Int
}{
	BlockSize: option.Int{Name: "block-size", Default: 16, Min: 1, Max: 1 << 16,
		Help: "vLLM --block-size"},
	KeyCacheSize: option.Int{Name: "key-cache-size", Default: blockkeys.DefaultKeyCacheSize, Min: -1, Max: 1 << 24,
		Help: "request-path block keys cached per key config, so shared prompt prefixes are not re-hashed (-1 = off)"},
	// 2 s is the value llm-d and Dynamo use.
	SpeculativeTTL: option.Duration{Name: "speculative-ttl", Default: 2 * time.Second, Range: option.Any,
		Help: "how long a picked pod is assumed to hold the request's blocks before its events arrive (negative = off)"},
	// 120 s is Dynamo's approximate-mode TTL.
	HistoryTTL: option.Duration{Name: "history-ttl", Default: 120 * time.Second, Range: option.Any,
		Help: "how long picks are remembered for pods without KV events (negative = off)"},
	SpeculativeCapacity: option.Int{Name: "speculative-capacity", Default: 1 << 18, Min: 0, Max: maxHoldCapacity,
		Help: "in-process speculative entries ((block, pod) pairs)"},
	HistoryCapacity: option.Int{Name: "history-capacity", Default: 1 << 20, Min: 0, Max: maxHoldCapacity,
		Help: "routing history bound in (block, pod) entries"},
	// Dynamo's conditional disaggregation defaults (routing.PDParams
	// cites them): max_local_prefill_length 1000, max_prefill_queue_size 2.
	PDMaxLocalPrefillTokens: option.Int{Name: "pick-max-local-prefill-tokens", Default: int64(routing.DefaultPD().MaxLocalPrefillTokens),
		Min: 0, Max: 1 << 24,
		Help: "P/D picks: the decode pod prefills a request itself when it would compute at most this many prompt tokens; more go to a prefill pod"},
	PDMaxPrefillWait: option.Int{Name: "pick-max-prefill-waiting", Default: int64(routing.DefaultPD().MaxPrefillWaiting),
		Min: -1, Max: 1 << 20,
		Help: "P/D picks: once the prefill candidates' waiting requests add up to this many, the decode pod prefills locally (-1 = no check)"},
	// 1 in 100 scored requests: a miss rate within minutes at router
	// traffic, at a cost the apply path does not show (see
	// BenchmarkApplyWithPrediction).
	PredictionSampleRate: option.Float{Name: "prediction-sample-rate", Default: 0.01, Min: 0, Max: 1,
		Help: "fraction of scored requests whose predicted blocks are checked against the engines' stored blocks (0 = off)"},
	PredictionWindow: option.Duration{Name: "prediction-window", Default: DefaultPredictionWindow, Range: option.Positive,
		Help: "how long a predicted block may take to be stored before it counts as missed"},
	PredictionCapacity: option.Int{Name: "prediction-capacity", Default: DefaultPredictionCapacity, Min: 0, Max: 1 << 24,
		Help: "predicted blocks awaited at once; more are dropped and counted"},
	LeaseTTL: option.Duration{Name: "lease-ttl", Default: 10 * time.Second, Range: option.Positive,
		Help: "with --leases: how long a dead daemon keeps its endpoints before another takes them over"},
	SnapshotInterval: option.Duration{Name: "snapshot-interval", Default: time.Minute, Range: option.Positive,
		Help: "time between two snapshots"},
	SnapshotMaxAge: option.Duration{Name: "snapshot-max-age", Default: time.Hour, Range: option.NonNegative,
		Help: "a snapshot older than this is not loaded (cold start): engines restarted meanwhile may have sequence numbers past it (0 = no bound)"},
	// About 7 bytes per (block, pod) entry: 1 GiB is ~150M entries, more
	// than a daemon's default capacity holds; the copy is held in memory
	// while it loads.
	PeerMaxBytes: option.Int{Name: "peer-max-bytes", Default: 1 << 30, Min: 1 << 10, Max: 1 << 40,
		Help: "with --peers: a peer's copy of the index larger than this is refused (it is held in memory while it loads)"},
	// 10M entries stream and load in seconds on loopback (performance.md);
	// a minute leaves room for a busy peer without delaying a cold start long.
	PeerTimeout: option.Duration{Name: "peer-timeout", Default: time.Minute, Range: option.Positive,
		Help: "with --peers: the deadline for fetching and loading a peer's index at start, every peer tried included; past it the daemon starts cold"},
	// A pick is held in 72 bytes: the default is under 5 MiB at most, and
	// covers a router's in-flight requests at thousands of picks a second
	// for as long as a generation takes. The maximum keeps the table's
	// page index small (4,096 pages of 1,024).
	FeedbackCapacity: option.Int{Name: "feedback-capacity", Default: 1 << 16, Min: 1, Max: 1 << 22,
		Help: "picks awaiting their engine's feedback (POST /v1/feedback); when full a new pick drops the oldest, counted"},
	// Longer than a long generation: the engine reports its usage when the
	// response is complete.
	FeedbackTTL: option.Duration{Name: "feedback-ttl", Default: 10 * time.Minute, Range: option.Positive,
		Help: "how long a pick awaits its engine's feedback before it is dropped, counted"},
	// 40 to 80 bytes an entry (the map doubles as it grows; 80 measured
	// at exactly the default, Go 1.26): at most ~320 MiB, for half the
	// entries the default in-memory index holds. The table fills only
	// once a worker is registered through Dynamo's POST /register.
	DynamoHashCapacity: option.Int{Name: "dynamo-hash-capacity", Default: 4 << 20, Min: 1, Max: 1 << 26,
		Help: "Dynamo API: blocks whose Dynamo LocalBlockHash is translated for /query_by_hash and /dump; filled from the first POST /register on; when full, entries of blocks no pod holds are swept and new ones refused, counted"},
}

// DefaultConfig is an in-memory indexer with every tunable of Options at its
// default, keyed as vLLM's defaults key blocks (SHA-256 CBOR, 16 tokens).
// No subscriber, persistence or leases: those are the caller's to turn on
// (their tunables are filled for when they are). Its PodShare is the
// in-memory index's; set it to 0 before choosing Redis, which cannot account
// entries per pod.
func DefaultConfig() Config {
	o := &Options
	return Config{
		Keys:            blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: blockkeys.DefaultSeed, BlockSize: int(o.BlockSize.Default)},
		Index:           IndexConfig{Capacity: kvindex.MemoryOptions.Capacity.Default},
		DigestCacheSize: int(applier.Options.DigestCacheSize.Default),
		KeyCacheSize:    int(o.KeyCacheSize.Default),
		ApplierLimits:   applier.DefaultLimits(),
		Pick: PickConfig{SpeculativeTTL: o.SpeculativeTTL.Default, HistoryTTL: o.HistoryTTL.Default,
			SpeculativeCapacity: int(o.SpeculativeCapacity.Default), HistoryCapacity: int(o.HistoryCapacity.Default),
			FeedbackCapacity: int(o.FeedbackCapacity.Default), FeedbackTTL: o.FeedbackTTL.Default},
		Prediction: PredictionConfig{SampleRate: o.PredictionSampleRate.Default, Window: o.PredictionWindow.Default,
			Capacity: int(o.PredictionCapacity.Default)},
		Leases:  LeaseConfig{TTL: o.LeaseTTL.Default},
		Persist: PersistConfig{Interval: o.SnapshotInterval.Default, MaxAge: o.SnapshotMaxAge.Default},
		Peers:   PeerConfig{MaxBytes: o.PeerMaxBytes.Default, Timeout: o.PeerTimeout.Default},

		DynamoHashCapacity: int(o.DynamoHashCapacity.Default),
	}
}

// ValidateConfig checks cfg's tunables against the ranges of Options (a zero
// field is valid where it stands for the default). The key configs and the
// pick policies are checked by New, which builds them.
func ValidateConfig(cfg Config) error {
	cfg = cfg.withDefaults()
	o := &Options
	errs := []error{
		o.KeyCacheSize.Check(int64(max(cfg.KeyCacheSize, -1))),   // any negative: off
		kvindex.MemoryOptions.Capacity.Check(cfg.Index.Capacity), // 0: the default
		applier.ValidateConfig(applier.Config{DigestCacheSize: cfg.DigestCacheSize, Limits: cfg.ApplierLimits}),
		o.SpeculativeCapacity.Check(int64(cfg.Pick.SpeculativeCapacity)),
		o.HistoryCapacity.Check(int64(cfg.Pick.HistoryCapacity)),
		o.FeedbackCapacity.Check(int64(cfg.Pick.FeedbackCapacity)),
		o.FeedbackTTL.Check(cfg.Pick.FeedbackTTL),
		o.DynamoHashCapacity.Check(int64(cfg.DynamoHashCapacity)),
		o.PredictionSampleRate.Check(cfg.Prediction.SampleRate),
		o.PredictionCapacity.Check(int64(cfg.Prediction.Capacity)),
		o.PredictionWindow.Check(cfg.Prediction.Window),
	}
	if cfg.TierWeights != nil {
		errs = append(errs, cfg.TierWeights.Validate())
	}
	if cfg.Leases.Enabled {
		errs = append(errs, o.LeaseTTL.Check(cfg.Leases.TTL))
	}
	if cfg.Persist.Path != "" {
		errs = append(errs, o.SnapshotInterval.Check(cfg.Persist.Interval), o.SnapshotMaxAge.Check(cfg.Persist.MaxAge))
	}
	if len(cfg.Peers.URLs) > 0 {
		errs = append(errs, o.PeerMaxBytes.Check(o.PeerMaxBytes.Or(cfg.Peers.MaxBytes)), o.PeerTimeout.Check(o.PeerTimeout.Or(cfg.Peers.Timeout)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("indexer: %w", err)
	}
	return nil
}

// withDefaults is the one place a zero field the indexer owns becomes its
// default; the applier, the memory index and the subscriber resolve theirs.
func (cfg Config) withDefaults() Config {
	o := &Options
	orInt := func(row option.Int, v int) int { return int(row.Or(int64(v))) }
	cfg.KeyCacheSize = orInt(o.KeyCacheSize, cfg.KeyCacheSize)
	p := &cfg.Pick
	p.SpeculativeTTL = o.SpeculativeTTL.Or(p.SpeculativeTTL)
	p.HistoryTTL = o.HistoryTTL.Or(p.HistoryTTL)
	p.SpeculativeCapacity = orInt(o.SpeculativeCapacity, p.SpeculativeCapacity)
	p.HistoryCapacity = orInt(o.HistoryCapacity, p.HistoryCapacity)
	p.FeedbackCapacity = orInt(o.FeedbackCapacity, p.FeedbackCapacity)
	p.FeedbackTTL = o.FeedbackTTL.Or(p.FeedbackTTL)
	cfg.DynamoHashCapacity = orInt(o.DynamoHashCapacity, cfg.DynamoHashCapacity)
	cfg.Prediction.Window = o.PredictionWindow.Or(cfg.Prediction.Window)
	cfg.Prediction.Capacity = orInt(o.PredictionCapacity, cfg.Prediction.Capacity)
	cfg.Leases.TTL = o.LeaseTTL.Or(cfg.Leases.TTL)
	cfg.Persist.Interval = o.SnapshotInterval.Or(cfg.Persist.Interval)
	return cfg
}
