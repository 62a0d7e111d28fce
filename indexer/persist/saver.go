package persist

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the snapshot writer and loader.
type Metrics struct {
	writes       *prometheus.CounterVec
	lastWrite    prometheus.Gauge
	bytes        prometheus.Gauge
	entries      prometheus.Gauge
	writeSeconds prometheus.Histogram
	restored     prometheus.Gauge
	loadSeconds  prometheus.Gauge
	loadFailures *prometheus.CounterVec
	tempRemoved  prometheus.Counter
}

// NewMetrics registers the snapshot metrics on reg (nil = unregistered).
func NewMetrics(reg *prometheus.Registry) (*Metrics, error) {
	m := &Metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindexd_snapshot_writes_total",
			Help: "Snapshot writes by result (ok, error)."}, []string{"result"}),
		lastWrite: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_snapshot_last_success_timestamp_seconds",
			Help: "When the last snapshot was written (Unix time)."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_snapshot_bytes",
			Help: "Size of the last snapshot file."}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_snapshot_entries",
			Help: "(block, pod) entries in the last snapshot file."}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvindexd_snapshot_write_seconds",
			Help: "Time to write one snapshot.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 12)}),
		restored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_snapshot_restored_entries",
			Help: "(block, pod) entries loaded from the snapshot at start (0 = cold start)."}),
		loadSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvindexd_snapshot_load_seconds",
			Help: "Time the snapshot load took at start."}),
		loadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvindexd_snapshot_load_failures_total",
			Help: "Snapshots not loaded at start (cold start instead) by reason: corrupt (checksum, truncation, counts), invalid (names or counts no event could have created), other (unreadable, incompatible)."},
			[]string{"reason"}),
		tempRemoved: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvindexd_snapshot_temp_files_removed_total",
			Help: "Temporary snapshot files left by an interrupted write, removed at start."}),
	}
	m.writes.WithLabelValues("ok")
	m.writes.WithLabelValues("error")
	for _, r := range []string{"corrupt", "invalid", "other"} {
		m.loadFailures.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.writes, m.lastWrite, m.bytes, m.entries, m.writeSeconds, m.restored, m.loadSeconds,
			m.loadFailures, m.tempRemoved} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Loaded records a load at start.
func (m *Metrics) Loaded(l *Loaded, took time.Duration) {
	m.restored.Set(float64(l.Entries))
	m.loadSeconds.Set(took.Seconds())
}

// LoadFailed records a snapshot that was not loaded.
func (m *Metrics) LoadFailed(err error) {
	switch {
	case errors.Is(err, ErrInvalid):
		m.loadFailures.WithLabelValues("invalid").Inc()
	case errors.Is(err, ErrCorrupt):
		m.loadFailures.WithLabelValues("corrupt").Inc()
	default:
		m.loadFailures.WithLabelValues("other").Inc()
	}
}

// TempRemoved records n temporary files removed at start.
func (m *Metrics) TempRemoved(n int) { m.tempRemoved.Add(float64(n)) }

// Saver writes a snapshot every interval and once more when stopped.
type Saver struct {
	Path     string
	Interval time.Duration
	Source   Source
	Metrics  *Metrics
	Log      *slog.Logger
}

// Save writes one snapshot now and records it.
func (s *Saver) Save() error {
	t0 := time.Now()
	w, err := Write(s.Path, s.Source, t0)
	took := time.Since(t0)
	if err != nil {
		s.Metrics.writes.WithLabelValues("error").Inc()
		s.Log.Error("snapshot write failed; the previous snapshot stays", "path", s.Path, "err", err)
		return err
	}
	s.Metrics.writes.WithLabelValues("ok").Inc()
	s.Metrics.lastWrite.Set(float64(time.Now().UnixNano()) / 1e9)
	s.Metrics.bytes.Set(float64(w.Bytes))
	s.Metrics.entries.Set(float64(w.Entries))
	s.Metrics.writeSeconds.Observe(took.Seconds())
	s.Log.Debug("snapshot written", "path", s.Path, "blocks", w.Blocks, "entries", w.Entries, "bytes", w.Bytes, "took", took)
	return nil
}

// Run saves every Interval until ctx is done. The final snapshot is the
// caller's (after the event path stopped, so it is the newest state).
func (s *Saver) Run(ctx context.Context) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.Save()
		}
	}
}
