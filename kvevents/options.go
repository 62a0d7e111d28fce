package kvevents

import (
	"errors"
	"runtime"

	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// Options is the one declaration of Config's tunables: each row's default,
// range and help. DefaultConfig, ValidateConfig, NewSubscriber's reading of
// a zero field and kvindexd's flags (and so docs/configuration.md) all read
// it. The Transport rows are the bounds the daemon sets on every socket; the
// upper ends exist so that a huge value is a start-up error, not a panic or
// an allocation sized up front.
var Options = struct {
	Workers, QueueSize                          option.Int
	MaxStreams, MaxModels, MaxDPRanks           option.Int
	ReplayTimeout, RebuildTimeout, PodExpiry    option.Duration
	RebuildAttemptTimeout                       option.Duration
	RebuildMaxBytes                             option.Int
	MaxMessageSize, MaxConns                    option.Int
	HandshakeTimeout, MessageTimeout, EvictIdle option.Duration
	BindFirstSeq                                option.Int
}{
	Workers: option.Int{Name: "workers", Default: 0, Min: 0, Max: 1024,
		Help: "event apply workers; a stream (pod, dp rank) always maps to the same one (0 = one per CPU)"},
	QueueSize: option.Int{Name: "queue-size", Default: DefaultQueueSize, Min: 0, Max: 1 << 20,
		Help: "batches queued per worker before overflow is counted"},
	MaxStreams: option.Int{Name: "max-streams", Default: DefaultMaxStreams, Min: 1, Max: 1 << 20,
		Help: "distinct (pod, dp rank) streams tracked; batches of further ones are dropped and counted"},
	MaxModels: option.Int{Name: "max-models", Default: DefaultMaxModels, Min: 1, Max: 1 << 16,
		Help: "distinct model names tracked; batches naming further ones are dropped and counted"},
	MaxDPRanks: option.Int{Name: "max-dp-ranks", Default: DefaultMaxDPRanks, Min: 1, Max: 1024,
		Help: "data-parallel ranks accepted per pod (rank must be below this)"},
	ReplayTimeout: option.Duration{Name: "replay-timeout", Default: DefaultReplayTimeout, Range: option.Positive,
		Help: "bound on one exchange with an engine's replay or snapshot address (a gap's replay, the catch-up at connect, " +
			"a snapshot); the stream's batches wait for it"},
	RebuildTimeout: option.Duration{Name: "rebuild-timeout", Default: DefaultRebuildTimeout, Range: option.Positive,
		Help: "bound on rebuilding a pod the index lost from its engine's whole replay buffer " +
			"(exchange and queuing); the pod's batches wait for it, and a rebuild cut short leaves the pod incomplete"},
	RebuildAttemptTimeout: option.Duration{Name: "rebuild-attempt-timeout", Default: DefaultRebuildAttemptTimeout, Range: option.Positive,
		Help: "bound on one rebuild's exchange with a replay address, the waits for room in the pod's queue share excluded " +
			"(the rebuild-timeout still bounds the whole); a replay past it is cut and the pod stays index_lost, so " +
			"one replay endpoint holds a rebuild worker at most this long"},
	RebuildMaxBytes: option.Int{Name: "rebuild-max-bytes", Default: DefaultRebuildMaxBytes, Min: 1, Max: 1 << 40,
		Help: "topics and payloads one rebuild's replay may send, bytes (more: the replay is cut and the pod stays index_lost)"},
	// In Config a negative PodExpiry is "never" and 0 the default; the
	// daemon's flag has no negative values, so there 0 is "never".
	PodExpiry: option.Duration{Name: "pod-expiry", Default: DefaultPodExpiry, Range: option.NonNegative,
		Help: "a stream silent this long is cleared from the index and forgotten (0 = never)"},
	MaxMessageSize: option.Int{Name: "zmq-max-message-size", Default: zmtp.DefaultMaxMessageSize, Min: 1, Max: 1 << 30,
		Help: "largest ZMQ message accepted, bytes (larger: the connection is closed)"},
	MaxConns: option.Int{Name: "zmq-max-conns", Default: zmtp.DefaultMaxConns, Min: 1, Max: 1 << 20,
		Help: "connections the ZMQ bind socket holds at once (then an idle one is evicted or the new one closed; " +
			"the last 1/8 are kept for hosts that published before)"},
	HandshakeTimeout: option.Duration{Name: "zmq-handshake-timeout", Default: zmtp.DefaultHandshakeTimeout, Range: option.Positive,
		Help: "deadline for a ZMQ peer's whole handshake"},
	MessageTimeout: option.Duration{Name: "zmq-message-timeout", Default: zmtp.DefaultMessageTimeout, Range: option.Positive,
		Help: "deadline for a ZMQ message to arrive whole once its first byte has"},
	BindFirstSeq: option.Int{Name: "bind-first-seq", Default: 0, Min: 0, Max: 1,
		Help: "the sequence number the publishers on the bind socket start at: 0 (vLLM, SGLang, TensorRT-LLM) or 1 " +
			"(llm-d's publishers, llm-d-inference-sim); a stream whose first batch carries it is complete from its start, " +
			"any other first number is a late join"},
	EvictIdle: option.Duration{Name: "zmq-evict-idle-after", Default: zmtp.DefaultEvictIdleAfter, Range: option.Positive,
		Help: "a ZMQ peer that delivered nothing this long may be evicted when the bind socket is full"},
}

// DefaultConfig is a Config with every tunable of Options at its default
// and the daemon's bind socket and topic filter. Endpoints are the caller's.
func DefaultConfig() Config {
	o := &Options
	return Config{
		Bind:                  DefaultBind,
		TopicFilter:           DefaultTopicFilter,
		Workers:               int(o.Workers.Default),
		QueueSize:             int(o.QueueSize.Default),
		ReplayTimeout:         o.ReplayTimeout.Default,
		RebuildTimeout:        o.RebuildTimeout.Default,
		RebuildAttemptTimeout: o.RebuildAttemptTimeout.Default,
		RebuildMaxBytes:       o.RebuildMaxBytes.Default,
		MaxStreams:            int(o.MaxStreams.Default),
		MaxModels:             int(o.MaxModels.Default),
		MaxDPRanks:            int(o.MaxDPRanks.Default),
		PodExpiry:             o.PodExpiry.Default,
		Transport: zmtp.Options{
			MaxMessageSize:   o.MaxMessageSize.Default,
			MaxConns:         int(o.MaxConns.Default),
			HandshakeTimeout: o.HandshakeTimeout.Default,
			MessageTimeout:   o.MessageTimeout.Default,
			EvictIdleAfter:   o.EvictIdle.Default,
		},
	}
}

// ValidateConfig checks cfg's tunables against the ranges of Options. A zero
// field is valid: it stands for the default.
func ValidateConfig(cfg Config) error {
	cfg = cfg.withDefaults()
	o := &Options
	errs := []error{
		o.Workers.Check(int64(cfg.Workers)), o.QueueSize.Check(int64(cfg.QueueSize)),
		o.MaxStreams.Check(int64(cfg.MaxStreams)), o.MaxModels.Check(int64(cfg.MaxModels)), o.MaxDPRanks.Check(int64(cfg.MaxDPRanks)),
		o.ReplayTimeout.Check(cfg.ReplayTimeout), o.RebuildTimeout.Check(cfg.RebuildTimeout),
		o.RebuildAttemptTimeout.Check(cfg.RebuildAttemptTimeout), o.RebuildMaxBytes.Check(cfg.RebuildMaxBytes),
		o.BindFirstSeq.Check(int64(cfg.BindFirstSeq)),
		o.MaxMessageSize.Check(cfg.Transport.MaxMessageSize), o.MaxConns.Check(int64(cfg.Transport.MaxConns)),
		o.HandshakeTimeout.Check(cfg.Transport.HandshakeTimeout), o.MessageTimeout.Check(cfg.Transport.MessageTimeout),
		o.EvictIdle.Check(cfg.Transport.EvictIdleAfter),
	}
	// PodExpiry: every value means something (negative = never).
	return errors.Join(errs...)
}

// withDefaults is the one place a zero field of Config becomes its default.
func (cfg Config) withDefaults() Config {
	o := &Options
	cfg.Workers = int(o.Workers.Or(int64(cfg.Workers)))
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	cfg.QueueSize = int(o.QueueSize.Or(int64(cfg.QueueSize)))
	cfg.MaxStreams = int(o.MaxStreams.Or(int64(cfg.MaxStreams)))
	cfg.MaxModels = int(o.MaxModels.Or(int64(cfg.MaxModels)))
	cfg.MaxDPRanks = int(o.MaxDPRanks.Or(int64(cfg.MaxDPRanks)))
	cfg.ReplayTimeout = o.ReplayTimeout.Or(cfg.ReplayTimeout)
	cfg.RebuildTimeout = o.RebuildTimeout.Or(cfg.RebuildTimeout)
	cfg.RebuildAttemptTimeout = o.RebuildAttemptTimeout.Or(cfg.RebuildAttemptTimeout)
	cfg.RebuildMaxBytes = o.RebuildMaxBytes.Or(cfg.RebuildMaxBytes)
	cfg.PodExpiry = o.PodExpiry.Or(cfg.PodExpiry)
	t := &cfg.Transport
	t.MaxMessageSize = o.MaxMessageSize.Or(t.MaxMessageSize)
	t.MaxConns = int(o.MaxConns.Or(int64(t.MaxConns)))
	t.HandshakeTimeout = o.HandshakeTimeout.Or(t.HandshakeTimeout)
	t.MessageTimeout = o.MessageTimeout.Or(t.MessageTimeout)
	t.EvictIdleAfter = o.EvictIdle.Or(t.EvictIdleAfter)
	// Internal bounds with no flag: their constants are their only
	// declaration.
	if cfg.QueueWait == 0 {
		cfg.QueueWait = DefaultQueueWait
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.MaxSnapshotRecords <= 0 {
		cfg.MaxSnapshotRecords = DefaultMaxSnapshotRecords
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = DefaultQueueBytes
	}
	return cfg
}
