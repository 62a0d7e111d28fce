package applier

import (
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/internal/option"
)

// Options is the one declaration of the applier's tunables
// (Config.DigestCacheSize and Limits): each row's default, range and help.
// DefaultLimits, ValidateConfig, New's reading of a zero field and
// kvindexd's flags all read it.
//
// A zero field means the row's default, except PodShare, where 0 is "no
// per-pod bound" (its default applies to the in-memory index, which the
// caller knows). A negative SessionsPerPod turns sessions off; the daemon's
// flag has no negative values, so there 0 is off.
var Options = struct {
	DigestCacheSize, MaxDigestCaches, MaxAliasTables, SessionsPerPod, MaxSessions, PodShare option.Int
}{
	DigestCacheSize: option.Int{Name: "digest-cache-size", Default: DefaultDigestCacheSize, Min: 0, Max: 1 << 24,
		Help: "recent block digests kept per model for the live parity check"},
	MaxDigestCaches: option.Int{Name: "max-digest-caches", Default: DefaultMaxDigestCaches, Min: 1, Max: 4096,
		Help: "models with a parity digest cache (~11 MB each); further models go unverified"},
	MaxAliasTables: option.Int{Name: "max-alias-tables", Default: DefaultMaxAliasTables, Min: 1, Max: 1 << 16,
		Help: "pods with an alias table (~4.7 MB each, pods whose hashes mismatch kvindex's); further pods are indexed without"},
	SessionsPerPod: option.Int{Name: "max-sessions-per-pod", Default: DefaultSessionsPerPod, Min: 0, Max: 1 << 20,
		Help: "sessions remembered per pod from vLLM's BlockStored.session_id, " +
			"the least recently stored forgotten first (kvindexd_session_evictions_total); 0 = not remembered"},
	MaxSessions: option.Int{Name: "max-sessions", Default: DefaultMaxSessions, Min: 1, Max: 1 << 24,
		Help: "sessions remembered by all pods together (~700 bytes each at most); beyond it a new session " +
			"evicts the least recently stored one of the pod holding the most (kvindexd_session_cap_evictions_total)"},
	PodShare: option.Int{Name: "pod-share", Default: DefaultPodShare, Min: 0, Max: 1 << 20,
		Help: "one pod holds at most capacity/N entries of the in-memory index (0 = no per-pod bound; " +
			"Redis has no per-pod accounting, so a number there fails at start)"},
}

// DefaultLimits is Limits with every row at its default, the pod share
// included (for the in-memory index).
func DefaultLimits() Limits {
	o := &Options
	return Limits{MaxDigestCaches: int(o.MaxDigestCaches.Default), MaxAliasTables: int(o.MaxAliasTables.Default),
		PodShare: int(o.PodShare.Default), SessionsPerPod: int(o.SessionsPerPod.Default), MaxSessions: int(o.MaxSessions.Default)}
}

// ValidateConfig checks cfg's tunables against Options (a zero field is
// valid where it stands for the default).
func ValidateConfig(cfg Config) error {
	cfg = cfg.withDefaults()
	o, l := &Options, cfg.Limits
	if err := errors.Join(o.DigestCacheSize.Check(int64(cfg.DigestCacheSize)),
		o.MaxDigestCaches.Check(int64(l.MaxDigestCaches)), o.MaxAliasTables.Check(int64(l.MaxAliasTables)),
		o.SessionsPerPod.Check(int64(max(l.SessionsPerPod, 0))), // negative: off
		o.MaxSessions.Check(int64(l.MaxSessions)),
		o.PodShare.Check(int64(l.PodShare))); err != nil {
		return fmt.Errorf("applier: %w", err)
	}
	return nil
}

// withDefaults is the one place a zero field of Config becomes its
// default: the rows of Options, and the table bounds no flag sets.
func (cfg Config) withDefaults() Config {
	o, l := &Options, &cfg.Limits
	cfg.DigestCacheSize = int(o.DigestCacheSize.Or(int64(cfg.DigestCacheSize)))
	l.MaxDigestCaches = int(o.MaxDigestCaches.Or(int64(l.MaxDigestCaches)))
	l.MaxAliasTables = int(o.MaxAliasTables.Or(int64(l.MaxAliasTables)))
	l.SessionsPerPod = int(o.SessionsPerPod.Or(int64(l.SessionsPerPod)))
	l.MaxSessions = int(o.MaxSessions.Or(int64(l.MaxSessions)))
	if cfg.AliasCacheSize <= 0 {
		cfg.AliasCacheSize = DefaultAliasCacheSize
	}
	if cfg.CopyTableSize <= 0 {
		cfg.CopyTableSize = DefaultCopyTableSize
	}
	if cfg.GroupMaskTableSize <= 0 {
		cfg.GroupMaskTableSize = DefaultGroupMaskTableSize
	}
	if cfg.HoldTableBytes <= 0 {
		cfg.HoldTableBytes = DefaultHoldTableBytes
	}
	return cfg
}
