package discovery

import (
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/internal/option"
)

// Options is the one declaration of Config's numeric tunables: each row's
// default, range and help. DefaultConfig, Validate, New's reading of a zero
// field, the pod annotations' bounds and kvindexd's --discover-* flags all
// read it.
var Options = struct {
	ZMQPort, ReplayPort, DPSize, ServePort, MaxPods option.Int
	PeerPort                                        option.Int
	Resync                                          option.Duration
}{
	ZMQPort: option.Int{Name: "discover-zmq-port", Default: DefaultZMQPort, Min: 1, Max: 65535,
		Help: "engines' ZMQ publisher port (DP rank r: port+r); pod annotation " + AnnotationZMQPort},
	ReplayPort: option.Int{Name: "discover-replay-port", Default: 0, Min: 0, Max: 65535,
		Help: "engines' replay port (0 = none; DP rank r: port+r); pod annotation " + AnnotationReplayPort},
	DPSize: option.Int{Name: "discover-dp-size", Default: 1, Min: 1, Max: 1024,
		Help: "data-parallel ranks per pod; pod annotation " + AnnotationDPSize},
	ServePort: option.Int{Name: "discover-serve-port", Default: DefaultServePort, Min: 1, Max: 65535,
		Help: "engines' request port, for pod names; pod annotation " + AnnotationServePort},
	MaxPods: option.Int{Name: "discover-max-pods", Default: DefaultMaxPods, Min: 1, Max: 1 << 20,
		Help: "most pods subscribed at once"},
	// 0: the replicas of one workload listen where this daemon does.
	PeerPort: option.Int{Name: "peer-port", Default: 0, Min: 0, Max: 65535,
		Help: "with --peer-selector: the replicas' HTTP port (0 = the port of --http-addr)"},
	Resync: option.Duration{Name: "discover-resync", Default: DefaultResync, Range: option.Positive,
		Help: "how often every watched pod is reconciled again"},
}

// DefaultConfig is Config with every default filled; the selector (and the
// namespaces) are the caller's.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

// withDefaults is the one place a zero field of Config becomes its default
// (ReplayPort's default is 0, none).
func (cfg Config) withDefaults() Config {
	o := &Options
	cfg.ZMQPort = int(o.ZMQPort.Or(int64(cfg.ZMQPort)))
	cfg.ServePort = int(o.ServePort.Or(int64(cfg.ServePort)))
	cfg.DPSize = int(o.DPSize.Or(int64(cfg.DPSize)))
	cfg.MaxPods = int(o.MaxPods.Or(int64(cfg.MaxPods)))
	cfg.Resync = o.Resync.Or(cfg.Resync)
	if cfg.PodName == "" {
		cfg.PodName = DefaultPodName
	}
	if cfg.ModelKey == "" {
		cfg.ModelKey = DefaultModelKey
	}
	if cfg.RoleLabel == "" {
		cfg.RoleLabel = DefaultRoleLabel
	}
	return cfg
}

// checkRanges checks cfg (defaults applied) against Options.
func checkRanges(cfg Config) error {
	o := &Options
	if err := errors.Join(o.ZMQPort.Check(int64(cfg.ZMQPort)), o.ReplayPort.Check(int64(cfg.ReplayPort)),
		o.DPSize.Check(int64(cfg.DPSize)), o.ServePort.Check(int64(cfg.ServePort)), o.MaxPods.Check(int64(cfg.MaxPods)),
		o.Resync.Check(cfg.Resync)); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	return nil
}
