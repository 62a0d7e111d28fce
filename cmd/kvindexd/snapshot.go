package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/snapshot"
)

// SnapshotConfig persists the in-memory index across restarts. It is
// embedded in Config (same file keys, flags, env).
type SnapshotConfig struct {
	SnapshotPath     string   `json:"snapshot_path" yaml:"snapshot_path"`
	SnapshotInterval Duration `json:"snapshot_interval" yaml:"snapshot_interval"`
	SnapshotMaxAge   Duration `json:"snapshot_max_age" yaml:"snapshot_max_age"`
}

func defaultSnapshot() SnapshotConfig {
	return SnapshotConfig{SnapshotInterval: Duration(time.Minute), SnapshotMaxAge: Duration(time.Hour)}
}

func snapshotFlags(fs *flag.FlagSet, c *SnapshotConfig) {
	fs.StringVar(&c.SnapshotPath, "snapshot-path", c.SnapshotPath, "file the in-memory index is saved to periodically and at shutdown, and loaded from at start (\"\" = off)")
	fs.Var(&c.SnapshotInterval, "snapshot-interval", "time between two snapshots")
	fs.Var(&c.SnapshotMaxAge, "snapshot-max-age", "a snapshot older than this is not loaded (cold start): engines restarted meanwhile may have sequence numbers past it")
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
	if c.SnapshotInterval <= 0 {
		return errors.New("--snapshot-interval must be positive")
	}
	return nil
}

// loadSnapshot loads the snapshot into the fresh index, before any event.
// Any failure is logged and the daemon starts cold: a snapshot is an
// optimisation, never a reason not to start.
func (d *daemon) loadSnapshot() *snapshot.Loaded {
	path := d.cfg.SnapshotPath
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		d.log.Info("no snapshot yet: cold start", "path", path)
		return nil
	}
	if err != nil {
		d.log.Warn("snapshot unreadable: cold start", "path", path, "err", err)
		return nil
	}
	if age := time.Since(st.ModTime()); age > time.Duration(d.cfg.SnapshotMaxAge) {
		d.log.Warn("snapshot older than --snapshot-max-age: cold start", "path", path, "age", age.Round(time.Second))
		return nil
	}
	t0 := time.Now()
	mem, ok := d.index.(*kvindex.MemoryIndex)
	if !ok {
		return nil
	}
	l, err := snapshot.Load(path, mem, d.interner)
	if err != nil {
		d.log.Error("snapshot not loaded: cold start", "path", path, "err", err)
		return nil
	}
	took := time.Since(t0)
	d.snapM.Loaded(l, took)
	d.log.Info("snapshot loaded; its pods are served once their streams resume", "path", path, "pods", len(l.Pods),
		"blocks", l.Blocks, "entries", l.Entries, "created", l.Created.UTC().Format(time.RFC3339), "took", took.Round(time.Millisecond))
	return l
}

// resumeSnapshot tells the indexer and the subscriber where each restored
// pod's stream was, so its first batch either resumes it, replays the gap,
// or clears it as restarted.
func (d *daemon) resumeSnapshot(l *snapshot.Loaded) {
	pods := make([]indexer.RestoredPod, 0, len(l.Pods))
	for _, p := range l.Pods {
		pods = append(pods, indexer.RestoredPod{Name: p.Name, DPRank: p.DPRank, Seq: p.Seq, HasSeq: p.HasSeq})
		if p.HasSeq {
			d.sub.ResumeFrom(p.Name, p.DPRank, p.Seq)
		}
	}
	d.idx.MarkRestored(pods)
}

// newSaver returns the periodic snapshot writer.
func (d *daemon) newSaver() (*snapshot.Saver, error) {
	mem, ok := d.index.(*kvindex.MemoryIndex)
	if !ok {
		return nil, fmt.Errorf("--snapshot-path needs the in-memory index")
	}
	return &snapshot.Saver{Path: d.cfg.SnapshotPath, Interval: time.Duration(d.cfg.SnapshotInterval), Metrics: d.snapM,
		Log: d.log.With("component", "snapshot"), Source: snapshot.Source{Index: mem, Interner: d.interner,
			Streams: func() []snapshot.StreamSeq {
				ss := d.sub.Streams()
				out := make([]snapshot.StreamSeq, 0, len(ss))
				for _, s := range ss {
					if s.Batches > 0 || s.LastSeq > 0 {
						out = append(out, snapshot.StreamSeq{Pod: s.Pod, DPRank: s.DPRank, Seq: s.LastSeq})
					}
				}
				return out
			}}}, nil
}
