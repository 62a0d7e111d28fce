package indexer

import (
	"errors"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer/persist"
)

// PersistConfig saves the in-memory index to a file periodically and at
// shutdown, and loads it at start, so a restarted daemon answers warm.
type PersistConfig struct {
	// Path of the snapshot file; "" turns persistence off.
	Path string
	// Interval between two snapshots (0 = Options.SnapshotInterval's default).
	Interval time.Duration
	// MaxAge: an older snapshot is not loaded (cold start), since engines
	// restarted meanwhile may have sequence numbers past it. A file dated
	// more than maxSnapshotClockSkew in the future is not loaded either. 0 =
	// no bound.
	MaxAge time.Duration
}

// maxSnapshotClockSkew is how far in the future a snapshot file's date may
// be (clocks of the writer and the loader, a copied file) before its age
// counts as unknown.
const maxSnapshotClockSkew = time.Minute

// persistence is the snapshot feature: the memory index it saves, the
// saver, and the metrics of both directions.
type persistence struct {
	indexer *Indexer
	cfg     PersistConfig
	lim     persist.Limits // the event limits a loaded file is held to
	m       *persist.Metrics
	saver   *persist.Saver
}

func (ix *Indexer) newPersistence(cfg PersistConfig, lim persist.Limits, reg *prometheus.Registry) (*persistence, error) {
	mem := ix.backend.memory
	if mem == nil {
		return nil, errors.New("indexer: persistence is for the in-memory index (Redis keeps the shared index itself)")
	}
	m, err := persist.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &persistence{indexer: ix, cfg: cfg, lim: lim, m: m}
	p.saver = &persist.Saver{Path: cfg.Path, Interval: cfg.Interval, Metrics: m,
		Log: ix.log.With("component", "snapshot"), Source: persist.Source{Index: mem, Interner: ix.in, Streams: p.streams}}
	return p, nil
}

// streams are the stream positions a snapshot records: the content is at
// least as new as these numbers (the saver reads them before the index).
func (p *persistence) streams() []persist.StreamSeq { return p.indexer.streamSeqs() }

// load loads the snapshot into the fresh index, before any event. Any
// failure is logged and the daemon starts cold: a snapshot is an
// optimisation, never a reason not to start.
func (p *persistence) load() *persist.Loaded {
	log, path := p.indexer.log, p.cfg.Path
	// A kill during a write leaves its temporary file; nothing else would
	// ever remove it, and each is as large as a snapshot.
	n, err := persist.RemoveTemp(path)
	p.m.TempRemoved(n)
	if err != nil {
		log.Warn("removing temporary snapshot files", "path", path, "removed", n, "err", err)
	} else if n > 0 {
		log.Info("removed temporary files of interrupted snapshot writes", "path", path, "removed", n)
	}
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		log.Info("no snapshot yet: cold start", "path", path)
		return nil
	}
	if err != nil {
		log.Warn("snapshot unreadable: cold start", "path", path, "err", err)
		return nil
	}
	age := time.Since(st.ModTime())
	if p.cfg.MaxAge > 0 && age > p.cfg.MaxAge {
		log.Warn("snapshot older than the maximum age: cold start", "path", path, "age", age.Round(time.Second),
			"max_age", p.cfg.MaxAge)
		return nil
	}
	// A file dated in the future has no age we can trust: a clock set
	// back, or a file touched to pass the check (dated 2200, it would be
	// loaded forever). Beyond a small skew it is refused like a stale one.
	if p.cfg.MaxAge > 0 && age < -maxSnapshotClockSkew {
		log.Warn("snapshot dated in the future: its age is unknown, cold start", "path", path,
			"mod_time", st.ModTime().UTC(), "max_age", p.cfg.MaxAge)
		return nil
	}
	t0 := time.Now()
	l, err := persist.LoadLimited(path, p.indexer.backend.memory, p.indexer.in, p.lim)
	if err != nil {
		p.m.LoadFailed(err)
		log.Error("snapshot not loaded: cold start", "path", path, "err", err)
		return nil
	}
	took := time.Since(t0)
	p.m.Loaded(l, took)
	log.Info("snapshot loaded; its pods are served once their streams resume", "path", path, "pods", len(l.Pods),
		"blocks", l.Blocks, "entries", l.Entries, "created", l.Created.UTC().Format(time.RFC3339), "took", took.Round(time.Millisecond))
	return l
}

// resumeRestored tells the subscriber where each restored pod's stream was,
// so its first batch either resumes it, replays the gap, or clears it as
// restarted; until then the pod is not served (restore.go).
func (ix *Indexer) resumeRestored(l *persist.Loaded) {
	for _, p := range l.Pods {
		if p.Complete && p.HasSeq {
			ix.sub.ResumeFromPeer(p.Name, p.DPRank, p.Seq, p.CompleteSince)
			continue
		}
		ix.sub.ResumeFrom(p.Name, p.DPRank, p.Seq, p.HasSeq)
	}
}
