package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/discovery"
	"github.com/kvindex/kvindex/kvindex/redisindex"
)

// SnapshotConfig persists the in-memory index across restarts. It is
// embedded in Config (same file keys, flags, env).
type SnapshotConfig struct {
	SnapshotPath     string   `json:"snapshot_path" yaml:"snapshot_path"`
	SnapshotInterval Duration `json:"snapshot_interval" yaml:"snapshot_interval"`
	SnapshotMaxAge   Duration `json:"snapshot_max_age" yaml:"snapshot_max_age"`
	// Peers: with no snapshot loaded, the index is fetched from the first
	// live peer instead (indexer/peer.go).
	Peers         []string `json:"peers" yaml:"peers"`
	PeerTokenFile string   `json:"peer_token_file" yaml:"peer_token_file"`
	PeerMaxBytes  int64    `json:"peer_max_bytes" yaml:"peer_max_bytes"`
	PeerTimeout   Duration `json:"peer_timeout" yaml:"peer_timeout"`
	// PeerSelector finds the peers in Kubernetes: the Ready pods of the
	// daemon's own workload, listed at start (daemon_discovery.go).
	PeerSelector  string `json:"peer_selector" yaml:"peer_selector"`
	PeerNamespace string `json:"peer_namespace" yaml:"peer_namespace"`
	PeerPort      int    `json:"peer_port" yaml:"peer_port"`
}

func snapshotFlags(fs *flag.FlagSet, c *SnapshotConfig) {
	fs.StringVar(&c.SnapshotPath, "snapshot-path", c.SnapshotPath, "file the in-memory index is saved to periodically and at shutdown, and loaded from at start (\"\" = off)")
	durationOpt(fs, &c.SnapshotInterval, indexer.Options.SnapshotInterval)
	durationOpt(fs, &c.SnapshotMaxAge, indexer.Options.SnapshotMaxAge)
	fs.Var(listFlag{&c.Peers}, "peers", "peer daemons' HTTP base URLs (comma or repeat): a daemon that loads no snapshot at start copies the first live peer's index and resumes the engines' streams where the copy was taken")
	fs.StringVar(&c.PeerTokenFile, "peer-token-file", c.PeerTokenFile, "with --peers: file holding the bearer token sent to the peers (an admin token in their --auth-token-file)")
	fs.StringVar(&c.PeerSelector, "peer-selector", c.PeerSelector, "Kubernetes label selector of this daemon's replicas: at start, the Ready ones but this pod are added to --peers (pods list in --peer-namespace; uses --kubeconfig or the in-cluster service account)")
	fs.StringVar(&c.PeerNamespace, "peer-namespace", c.PeerNamespace, "with --peer-selector: the replicas' namespace (default: this pod's, from its service account)")
	intOpt(fs, &c.PeerPort, discovery.Options.PeerPort)
	int64Opt(fs, &c.PeerMaxBytes, indexer.Options.PeerMaxBytes)
	durationOpt(fs, &c.PeerTimeout, indexer.Options.PeerTimeout)
}

func (c *SnapshotConfig) validateSnapshot(index string) error {
	for _, p := range c.Peers {
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--peers %q: want an http:// or https:// base URL of a peer daemon's HTTP port", p)
		}
	}
	if c.PeerSelector != "" {
		if _, err := labels.Parse(c.PeerSelector); err != nil {
			return fmt.Errorf("--peer-selector %q: %w", c.PeerSelector, err)
		}
	}
	if len(c.Peers) > 0 || c.PeerSelector != "" {
		f, err := redisindex.ParseIndexFlag(index)
		if err != nil {
			return err
		}
		if !f.Memory {
			return errors.New("--peers and --peer-selector are for the in-memory index (Redis keeps the shared index itself)")
		}
	}
	if c.SnapshotPath == "" {
		return nil
	}
	f, err := redisindex.ParseIndexFlag(index)
	if err != nil {
		return err
	}
	if !f.Memory {
		return errors.New("--snapshot-path is for the in-memory index (Redis keeps the shared index itself)")
	}
	return nil
}

// peerConfig is the indexer's peer recovery configuration; the token is
// read from its file once, at start.
func (c *SnapshotConfig) peerConfig() (indexer.PeerConfig, error) {
	pc := indexer.PeerConfig{URLs: c.Peers, MaxBytes: c.PeerMaxBytes, Timeout: time.Duration(c.PeerTimeout)}
	if c.PeerTokenFile != "" {
		b, err := os.ReadFile(c.PeerTokenFile)
		if err != nil {
			return pc, fmt.Errorf("--peer-token-file: %w", err)
		}
		if pc.Token = strings.TrimSpace(string(b)); pc.Token == "" {
			return pc, fmt.Errorf("--peer-token-file %s: empty", c.PeerTokenFile)
		}
	}
	return pc, nil
}

// persistConfig is the indexer's persistence configuration.
func (c *SnapshotConfig) persistConfig() indexer.PersistConfig {
	return indexer.PersistConfig{Path: c.SnapshotPath, Interval: time.Duration(c.SnapshotInterval),
		MaxAge: time.Duration(c.SnapshotMaxAge)}
}
