package main

import (
	"errors"
	"flag"
	"time"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvindex/redisindex"
)

// SnapshotConfig persists the in-memory index across restarts. It is
// embedded in Config (same file keys, flags, env).
type SnapshotConfig struct {
	SnapshotPath     string   `json:"snapshot_path" yaml:"snapshot_path"`
	SnapshotInterval Duration `json:"snapshot_interval" yaml:"snapshot_interval"`
	SnapshotMaxAge   Duration `json:"snapshot_max_age" yaml:"snapshot_max_age"`
}

func snapshotFlags(fs *flag.FlagSet, c *SnapshotConfig) {
	fs.StringVar(&c.SnapshotPath, "snapshot-path", c.SnapshotPath, "file the in-memory index is saved to periodically and at shutdown, and loaded from at start (\"\" = off)")
	durationOpt(fs, &c.SnapshotInterval, indexer.Options.SnapshotInterval)
	durationOpt(fs, &c.SnapshotMaxAge, indexer.Options.SnapshotMaxAge)
}

func (c *SnapshotConfig) validateSnapshot(index string) error {
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

// persistConfig is the indexer's persistence configuration.
func (c *SnapshotConfig) persistConfig() indexer.PersistConfig {
	return indexer.PersistConfig{Path: c.SnapshotPath, Interval: time.Duration(c.SnapshotInterval),
		MaxAge: time.Duration(c.SnapshotMaxAge)}
}
