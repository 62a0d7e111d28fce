package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// LimitsConfig bounds what publishers on the ZMQ port can make the daemon
// hold. Every zero value means the documented default (docs/security.md, "State
// limits"); it is inlined into Config, so its keys sit at the top level of the
// config file.
type LimitsConfig struct {
	ZMQMaxMessageSize   int64    `json:"zmq_max_message_size" yaml:"zmq_max_message_size"`
	ZMQHandshakeTimeout Duration `json:"zmq_handshake_timeout" yaml:"zmq_handshake_timeout"`
	ZMQMaxConns         int      `json:"zmq_max_conns" yaml:"zmq_max_conns"`
	ZMQMessageTimeout   Duration `json:"zmq_message_timeout" yaml:"zmq_message_timeout"`
	ZMQEvictIdleAfter   Duration `json:"zmq_evict_idle_after" yaml:"zmq_evict_idle_after"`
	ReplayTimeout       Duration `json:"replay_timeout" yaml:"replay_timeout"`
	RebuildTimeout      Duration `json:"rebuild_timeout" yaml:"rebuild_timeout"`
	MaxStreams          int      `json:"max_streams" yaml:"max_streams"`
	MaxModels           int      `json:"max_models" yaml:"max_models"`
	MaxDPRanks          int      `json:"max_dp_ranks" yaml:"max_dp_ranks"`
	PodExpiry           Duration `json:"pod_expiry" yaml:"pod_expiry"`
	MaxDigestCaches     int      `json:"max_digest_caches" yaml:"max_digest_caches"`
	MaxAliasTables      int      `json:"max_alias_tables" yaml:"max_alias_tables"`
	MaxSessionsPerPod   int      `json:"max_sessions_per_pod" yaml:"max_sessions_per_pod"`
	// PodShare is nil for the backend's default: applier.DefaultPodShare
	// with the in-memory index, none with Redis (which has no per-pod
	// accounting; a share set explicitly there is a start-up error).
	PodShare *int `json:"pod_share" yaml:"pod_share"`
}

func defaultLimits() LimitsConfig {
	return LimitsConfig{
		ZMQMaxMessageSize:   zmtp.DefaultMaxMessageSize,
		ZMQHandshakeTimeout: Duration(zmtp.DefaultHandshakeTimeout),
		ZMQMaxConns:         zmtp.DefaultMaxConns,
		ZMQMessageTimeout:   Duration(zmtp.DefaultMessageTimeout),
		ZMQEvictIdleAfter:   Duration(zmtp.DefaultEvictIdleAfter),
		ReplayTimeout:       Duration(kvevents.DefaultReplayTimeout),
		RebuildTimeout:      Duration(kvevents.DefaultRebuildTimeout),
		MaxStreams:          kvevents.DefaultMaxStreams,
		MaxModels:           kvevents.DefaultMaxModels,
		MaxDPRanks:          kvevents.DefaultMaxDPRanks,
		PodExpiry:           Duration(kvevents.DefaultPodExpiry),
		MaxDigestCaches:     applier.DefaultMaxDigestCaches,
		MaxAliasTables:      applier.DefaultMaxAliasTables,
		MaxSessionsPerPod:   applier.DefaultSessionsPerPod,
	}
}

func limitFlags(fs *flag.FlagSet, l *LimitsConfig) {
	fs.Int64Var(&l.ZMQMaxMessageSize, "zmq-max-message-size", l.ZMQMaxMessageSize, "largest ZMQ message accepted, bytes (larger: the connection is closed)")
	fs.Var(&l.ZMQHandshakeTimeout, "zmq-handshake-timeout", "deadline for a ZMQ peer's whole handshake")
	fs.IntVar(&l.ZMQMaxConns, "zmq-max-conns", l.ZMQMaxConns, "connections the ZMQ bind socket holds at once (then an idle one is evicted or the new one closed; "+
		"the last 1/8 are kept for hosts that published before)")
	fs.Var(&l.ZMQMessageTimeout, "zmq-message-timeout", "deadline for a ZMQ message to arrive whole once its first byte has")
	fs.Var(&l.ZMQEvictIdleAfter, "zmq-evict-idle-after", "a ZMQ peer that delivered nothing this long may be evicted when the bind socket is full")
	fs.Var(&l.ReplayTimeout, "replay-timeout", "bound on one exchange with an engine's replay or snapshot address (a gap's replay, the catch-up at connect, "+
		"a snapshot); the stream's batches wait for it")
	fs.Var(&l.RebuildTimeout, "rebuild-timeout", "bound on rebuilding a pod the index lost from its engine's whole replay buffer "+
		"(exchange and queuing); the pod's batches wait for it, and a rebuild cut short leaves the pod incomplete")
	fs.IntVar(&l.MaxStreams, "max-streams", l.MaxStreams, "distinct (pod, dp rank) streams tracked; batches of further ones are dropped and counted")
	fs.IntVar(&l.MaxModels, "max-models", l.MaxModels, "distinct model names tracked; batches naming further ones are dropped and counted")
	fs.IntVar(&l.MaxDPRanks, "max-dp-ranks", l.MaxDPRanks, "data-parallel ranks accepted per pod (rank must be below this)")
	fs.Var(&l.PodExpiry, "pod-expiry", "a stream silent this long is cleared from the index and forgotten (0 = never)")
	fs.IntVar(&l.MaxDigestCaches, "max-digest-caches", l.MaxDigestCaches, "models with a parity digest cache (~11 MB each); further models go unverified")
	fs.IntVar(&l.MaxAliasTables, "max-alias-tables", l.MaxAliasTables, "pods with an alias table (~4.7 MB each, pods whose hashes mismatch kvindex's); further pods are indexed without")
	fs.IntVar(&l.MaxSessionsPerPod, "max-sessions-per-pod", l.MaxSessionsPerPod, "sessions remembered per pod from vLLM's BlockStored.session_id, "+
		"the least recently stored forgotten first (kvindexd_session_evictions_total); 0 = not remembered")
	fs.Var(podShareFlag{&l.PodShare}, "pod-share", fmt.Sprintf("one pod holds at most capacity/N entries of the in-memory index (0 = no per-pod bound; "+
		"auto = %d in memory, none with Redis; Redis has no per-pod accounting, so a number there fails at start)", applier.DefaultPodShare))
}

func (l *LimitsConfig) validate() error {
	if l.ZMQMaxMessageSize <= 0 || l.ZMQMaxConns <= 0 || l.MaxStreams <= 0 || l.MaxModels <= 0 || l.MaxDPRanks <= 0 ||
		l.MaxDigestCaches <= 0 || l.MaxAliasTables <= 0 {
		return errors.New("--zmq-max-message-size, --zmq-max-conns, --max-streams, --max-models, --max-dp-ranks, " +
			"--max-digest-caches and --max-alias-tables must be positive")
	}
	if l.MaxSessionsPerPod < 0 {
		return errors.New("--max-sessions-per-pod must not be negative")
	}
	if l.PodShare != nil && *l.PodShare < 0 {
		return errors.New("--pod-share must not be negative")
	}
	return nil
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
		share = applier.DefaultPodShare
	}
	sessions := l.MaxSessionsPerPod
	if sessions == 0 {
		sessions = -1 // off (0 is the applier's default)
	}
	return applier.Limits{MaxDigestCaches: l.MaxDigestCaches, MaxAliasTables: l.MaxAliasTables, PodShare: share,
		SessionsPerPod: sessions}
}

// podShareFlag is --pod-share: a number, or auto (unset) for the
// backend's default.
type podShareFlag struct{ p **int }

func (f podShareFlag) String() string {
	if f.p == nil || *f.p == nil {
		return "auto"
	}
	return strconv.Itoa(**f.p)
}

func (f podShareFlag) Set(s string) error {
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
