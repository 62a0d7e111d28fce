package main

import (
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvevents"
)

// LimitsConfig bounds what publishers on the ZMQ port can make the daemon
// hold (docs/security.md, "State limits"); defaults, ranges and help are the
// rows of kvevents.Options and applier.Options. It is inlined into
// Config, so its keys sit at the top level of the config file.
type LimitsConfig struct {
	ZMQMaxMessageSize   int64    `json:"zmq_max_message_size" yaml:"zmq_max_message_size"`
	ZMQHandshakeTimeout Duration `json:"zmq_handshake_timeout" yaml:"zmq_handshake_timeout"`
	ZMQMaxConns         int      `json:"zmq_max_conns" yaml:"zmq_max_conns"`
	ZMQMessageTimeout   Duration `json:"zmq_message_timeout" yaml:"zmq_message_timeout"`
	ZMQEvictIdleAfter   Duration `json:"zmq_evict_idle_after" yaml:"zmq_evict_idle_after"`
	ReplayTimeout       Duration `json:"replay_timeout" yaml:"replay_timeout"`
	RebuildTimeout      Duration `json:"rebuild_timeout" yaml:"rebuild_timeout"`
	RebuildAttempt      Duration `json:"rebuild_attempt_timeout" yaml:"rebuild_attempt_timeout"`
	RebuildMaxBytes     int64    `json:"rebuild_max_bytes" yaml:"rebuild_max_bytes"`
	MaxStreams          int      `json:"max_streams" yaml:"max_streams"`
	MaxModels           int      `json:"max_models" yaml:"max_models"`
	MaxDPRanks          int      `json:"max_dp_ranks" yaml:"max_dp_ranks"`
	PodExpiry           Duration `json:"pod_expiry" yaml:"pod_expiry"`
	MaxDigestCaches     int      `json:"max_digest_caches" yaml:"max_digest_caches"`
	MaxAliasTables      int      `json:"max_alias_tables" yaml:"max_alias_tables"`
	MaxSessionsPerPod   int      `json:"max_sessions_per_pod" yaml:"max_sessions_per_pod"`
	MaxSessions         int      `json:"max_sessions" yaml:"max_sessions"`
	// PodShare is nil for the backend's default: applier.Options.PodShare's
	// with the in-memory index, none with Redis (which has no per-pod
	// accounting; a share set explicitly there is a start-up error).
	PodShare *int `json:"pod_share" yaml:"pod_share"`
}

// defaultLimits takes the limits' defaults from the subscriber's and the
// indexer's DefaultConfig. The daemon's 0 for --pod-expiry and
// --max-sessions-per-pod means never / none (the libraries' negative).
func defaultLimits(ev kvevents.Config, ix indexer.Config) LimitsConfig {
	return LimitsConfig{
		ZMQMaxMessageSize:   ev.Transport.MaxMessageSize,
		ZMQHandshakeTimeout: Duration(ev.Transport.HandshakeTimeout),
		ZMQMaxConns:         ev.Transport.MaxConns,
		ZMQMessageTimeout:   Duration(ev.Transport.MessageTimeout),
		ZMQEvictIdleAfter:   Duration(ev.Transport.EvictIdleAfter),
		ReplayTimeout:       Duration(ev.ReplayTimeout),
		RebuildTimeout:      Duration(ev.RebuildTimeout),
		RebuildAttempt:      Duration(ev.RebuildAttemptTimeout),
		RebuildMaxBytes:     ev.RebuildMaxBytes,
		MaxStreams:          ev.MaxStreams,
		MaxModels:           ev.MaxModels,
		MaxDPRanks:          ev.MaxDPRanks,
		PodExpiry:           Duration(ev.PodExpiry),
		MaxDigestCaches:     ix.ApplierLimits.MaxDigestCaches,
		MaxAliasTables:      ix.ApplierLimits.MaxAliasTables,
		MaxSessionsPerPod:   ix.ApplierLimits.SessionsPerPod,
		MaxSessions:         ix.ApplierLimits.MaxSessions,
	}
}

func limitFlags(fs *flag.FlagSet, l *LimitsConfig) {
	ev, ap := &kvevents.Options, &applier.Options
	int64Opt(fs, &l.ZMQMaxMessageSize, ev.MaxMessageSize)
	durationOpt(fs, &l.ZMQHandshakeTimeout, ev.HandshakeTimeout)
	intOpt(fs, &l.ZMQMaxConns, ev.MaxConns)
	durationOpt(fs, &l.ZMQMessageTimeout, ev.MessageTimeout)
	durationOpt(fs, &l.ZMQEvictIdleAfter, ev.EvictIdle)
	durationOpt(fs, &l.ReplayTimeout, ev.ReplayTimeout)
	durationOpt(fs, &l.RebuildTimeout, ev.RebuildTimeout)
	durationOpt(fs, &l.RebuildAttempt, ev.RebuildAttemptTimeout)
	int64Opt(fs, &l.RebuildMaxBytes, ev.RebuildMaxBytes)
	intOpt(fs, &l.MaxStreams, ev.MaxStreams)
	intOpt(fs, &l.MaxModels, ev.MaxModels)
	intOpt(fs, &l.MaxDPRanks, ev.MaxDPRanks)
	durationOpt(fs, &l.PodExpiry, ev.PodExpiry)
	intOpt(fs, &l.MaxDigestCaches, ap.MaxDigestCaches)
	intOpt(fs, &l.MaxAliasTables, ap.MaxAliasTables)
	intOpt(fs, &l.MaxSessionsPerPod, ap.SessionsPerPod)
	intOpt(fs, &l.MaxSessions, ap.MaxSessions)
	declare(fs, &podShareFlag{&l.PodShare, ap.PodShare}, ap.PodShare.Name, ap.PodShare.Help)
}

// subscriber applies the limits to a kvevents config.
func (l *LimitsConfig) subscriber(c *kvevents.Config) {
	handshake, expiry := time.Duration(l.ZMQHandshakeTimeout), time.Duration(l.PodExpiry) // validated
	c.Transport.MaxMessageSize = l.ZMQMaxMessageSize
	c.Transport.HandshakeTimeout = handshake
	c.Transport.MaxConns = l.ZMQMaxConns
	c.Transport.MessageTimeout, c.Transport.EvictIdleAfter = time.Duration(l.ZMQMessageTimeout), time.Duration(l.ZMQEvictIdleAfter) // validated
	c.MaxStreams, c.MaxModels, c.MaxDPRanks = l.MaxStreams, l.MaxModels, l.MaxDPRanks
	c.ReplayTimeout, c.RebuildTimeout = time.Duration(l.ReplayTimeout), time.Duration(l.RebuildTimeout) // validated
	c.RebuildAttemptTimeout, c.RebuildMaxBytes = time.Duration(l.RebuildAttempt), l.RebuildMaxBytes     // validated
	c.PodExpiry = expiry
	if expiry == 0 {
		c.PodExpiry = -1 // never
	}
}

// applier applies the limits to the applier; memory tells the backend,
// which decides the pod share's default.
func (l *LimitsConfig) applier(memory bool) applier.Limits {
	share := 0
	switch {
	case l.PodShare != nil:
		share = *l.PodShare
	case memory:
		share = int(applier.Options.PodShare.Default)
	}
	sessions := l.MaxSessionsPerPod
	if sessions == 0 {
		sessions = -1 // off (0 is the applier's default)
	}
	return applier.Limits{MaxDigestCaches: l.MaxDigestCaches, MaxAliasTables: l.MaxAliasTables, PodShare: share,
		SessionsPerPod: sessions, MaxSessions: l.MaxSessions}
}

// podShareFlag is --pod-share: a number, or auto (unset) for the
// backend's default (the row's in memory, none with Redis).
type podShareFlag struct {
	p   **int
	row option.Int
}

func (f *podShareFlag) String() string {
	if f == nil || f.p == nil || *f.p == nil {
		return "auto"
	}
	return strconv.Itoa(**f.p)
}

func (f *podShareFlag) Get() any { return *f.p }

func (f *podShareFlag) check() error {
	if *f.p == nil {
		return nil
	}
	return f.row.Check(int64(**f.p))
}

func (f *podShareFlag) rangeText() string {
	return fmt.Sprintf("%s, or auto: %d in memory, none with Redis", f.row.Range(), f.row.Default)
}
func (f *podShareFlag) defaultText() string { return "auto" }
func (f *podShareFlag) target() uintptr     { return reflect.ValueOf(f.p).Pointer() }

func (f *podShareFlag) Set(s string) error {
	if s == "auto" {
		*f.p = nil
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want a number or auto")
	}
	*f.p = &n
	return nil
}
