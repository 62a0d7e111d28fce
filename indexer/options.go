package indexer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvindex"
)

// Options is the one declaration of the indexer's tunables and those of the
// parts it builds (block keys, the in-memory index, the applier, Pick's
// speculation and history, prediction, leases, snapshots): each row's
// default, range and help. DefaultConfig, ValidateConfig, New's reading of a
// zero field and kvindexd's flags (and so docs/configuration.md) all read it.
//
// What 0 means in Config: the row's default, read in withDefaults and
// nowhere else; except where 0 is itself a setting, said at the field
// (Prediction.SampleRate: off; Persist.MaxAge: no bound;
// ApplierLimits.PodShare: no per-pod bound). DefaultConfig fills every field.
var Options = struct {
	BlockSize, KeyCacheSize, DigestCacheSize, Capacity        option.Int
	MaxDigestCaches, MaxAliasTables, SessionsPerPod, PodShare option.Int
	SpeculativeTTL, HistoryTTL                                option.Duration
	SpeculativeCapacity, HistoryCapacity                      option.Int
	PredictionSampleRate                                      option.Float
	PredictionWindow                                          option.Duration
	PredictionCapacity                                        option.Int
	LeaseTTL, SnapshotInterval, SnapshotMaxAge                option.Duration
}{
	BlockSize: option.Int{Name: "block-size", Default: 16, Min: 1, Max: 1 << 16,
		Help: "vLLM --block-size"},
	KeyCacheSize: option.Int{Name: "key-cache-size", Default: kvindex.DefaultKeyCacheSize, Min: -1, Max: 1 << 24,
		Help: "request-path block keys cached per key config, so shared prompt prefixes are not re-hashed (-1 = off)"},
	DigestCacheSize: option.Int{Name: "digest-cache-size", Default: kvindex.DefaultDigestCacheSize, Min: 0, Max: 1 << 24,
		Help: "recent block digests kept per model for the live parity check"},
	Capacity: option.Int{Name: "capacity", Default: kvindex.DefaultMemoryCapacity, Min: 0, Max: 1 << 32,
		Help: "in-memory index bound in (block, pod) entries"},
	MaxDigestCaches: option.Int{Name: "max-digest-caches", Default: kvindex.DefaultMaxDigestCaches, Min: 1, Max: 4096,
		Help: "models with a parity digest cache (~11 MB each); further models go unverified"},
	MaxAliasTables: option.Int{Name: "max-alias-tables", Default: kvindex.DefaultMaxAliasTables, Min: 1, Max: 1 << 16,
		Help: "pods with an alias table (~4.7 MB each, pods whose hashes mismatch kvindex's); further pods are indexed without"},
	// In ApplierLimits a negative SessionsPerPod is "off" and 0 the
	// default; the daemon's flag has no negative values, so there 0 is off.
	SessionsPerPod: option.Int{Name: "max-sessions-per-pod", Default: kvindex.DefaultSessionsPerPod, Min: 0, Max: 1 << 20,
		Help: "sessions remembered per pod from vLLM's BlockStored.session_id, " +
			"the least recently stored forgotten first (kvindexd_session_evictions_total); 0 = not remembered"},
	PodShare: option.Int{Name: "pod-share", Default: kvindex.DefaultPodShare, Min: 0, Max: 1 << 20,
		Help: "one pod holds at most capacity/N entries of the in-memory index (0 = no per-pod bound; " +
			"Redis has no per-pod accounting, so a number there fails at start)"},
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
		Keys:            kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, BlockSize: int(o.BlockSize.Default)},
		Index:           IndexConfig{Capacity: o.Capacity.Default},
		DigestCacheSize: int(o.DigestCacheSize.Default),
		KeyCacheSize:    int(o.KeyCacheSize.Default),
		ApplierLimits: kvindex.ApplierLimits{MaxDigestCaches: int(o.MaxDigestCaches.Default), MaxAliasTables: int(o.MaxAliasTables.Default),
			PodShare: int(o.PodShare.Default), SessionsPerPod: int(o.SessionsPerPod.Default)},
		Pick: PickConfig{SpeculativeTTL: o.SpeculativeTTL.Default, HistoryTTL: o.HistoryTTL.Default,
			SpeculativeCapacity: int(o.SpeculativeCapacity.Default), HistoryCapacity: int(o.HistoryCapacity.Default)},
		Prediction: PredictionConfig{SampleRate: o.PredictionSampleRate.Default, Window: o.PredictionWindow.Default,
			Capacity: int(o.PredictionCapacity.Default)},
		Leases:  LeaseConfig{TTL: o.LeaseTTL.Default},
		Persist: PersistConfig{Interval: o.SnapshotInterval.Default, MaxAge: o.SnapshotMaxAge.Default},
	}
}

// ValidateConfig checks cfg's tunables against the ranges of Options (a zero
// field is valid where it stands for the default). The key configs and the
// pick policies are checked by New, which builds them.
func ValidateConfig(cfg Config) error {
	cfg = cfg.withDefaults()
	o := &Options
	errs := []error{
		o.KeyCacheSize.Check(int64(max(cfg.KeyCacheSize, -1))), // any negative: off
		o.DigestCacheSize.Check(int64(cfg.DigestCacheSize)),
		o.Capacity.Check(cfg.Index.Capacity),
		o.MaxDigestCaches.Check(int64(cfg.ApplierLimits.MaxDigestCaches)),
		o.MaxAliasTables.Check(int64(cfg.ApplierLimits.MaxAliasTables)),
		o.PodShare.Check(int64(cfg.ApplierLimits.PodShare)),
		o.SessionsPerPod.Check(int64(max(cfg.ApplierLimits.SessionsPerPod, 0))), // negative: off
		o.SpeculativeCapacity.Check(int64(cfg.Pick.SpeculativeCapacity)),
		o.HistoryCapacity.Check(int64(cfg.Pick.HistoryCapacity)),
		o.PredictionSampleRate.Check(cfg.Prediction.SampleRate),
		o.PredictionCapacity.Check(int64(cfg.Prediction.Capacity)),
		o.PredictionWindow.Check(cfg.Prediction.Window),
	}
	if cfg.Leases.Enabled {
		errs = append(errs, o.LeaseTTL.Check(cfg.Leases.TTL))
	}
	if cfg.Persist.Path != "" {
		errs = append(errs, o.SnapshotInterval.Check(cfg.Persist.Interval), o.SnapshotMaxAge.Check(cfg.Persist.MaxAge))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("indexer: %w", err)
	}
	return nil
}

// withDefaults is the one place a zero field of Config becomes its default.
func (cfg Config) withDefaults() Config {
	o := &Options
	orInt := func(row option.Int, v int) int { return int(row.Or(int64(v))) }
	cfg.KeyCacheSize = orInt(o.KeyCacheSize, cfg.KeyCacheSize)
	cfg.DigestCacheSize = orInt(o.DigestCacheSize, cfg.DigestCacheSize)
	cfg.Index.Capacity = o.Capacity.Or(cfg.Index.Capacity)
	l := &cfg.ApplierLimits
	l.MaxDigestCaches = orInt(o.MaxDigestCaches, l.MaxDigestCaches)
	l.MaxAliasTables = orInt(o.MaxAliasTables, l.MaxAliasTables)
	l.SessionsPerPod = orInt(o.SessionsPerPod, l.SessionsPerPod)
	p := &cfg.Pick
	p.SpeculativeTTL = o.SpeculativeTTL.Or(p.SpeculativeTTL)
	p.HistoryTTL = o.HistoryTTL.Or(p.HistoryTTL)
	p.SpeculativeCapacity = orInt(o.SpeculativeCapacity, p.SpeculativeCapacity)
	p.HistoryCapacity = orInt(o.HistoryCapacity, p.HistoryCapacity)
	cfg.Prediction.Window = o.PredictionWindow.Or(cfg.Prediction.Window)
	cfg.Prediction.Capacity = orInt(o.PredictionCapacity, cfg.Prediction.Capacity)
	cfg.Leases.TTL = o.LeaseTTL.Or(cfg.Leases.TTL)
	cfg.Persist.Interval = o.SnapshotInterval.Or(cfg.Persist.Interval)
	return cfg
}
