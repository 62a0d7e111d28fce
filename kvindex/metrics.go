package kvindex

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the applier's and the index's Prometheus metrics (namespace
// "kvindex"). Labelled counters are resolved to their children once, here, so
// the apply path never does a label lookup. Per-pod series and the index's own
// counters are not duplicated here: the indexer package exports them at scrape
// time from Applier.PodStats and Index.Stats (kvindexd_pod_*, kvindexd_index_*).
type Metrics struct {
	events             [AllBlocksCleared + 1]prometheus.Counter // by EventKind
	blocksStored       prometheus.Counter
	blocksRemoved      prometheus.Counter
	blocksUnkeyed      prometheus.Counter
	parityMatches      prometheus.Counter
	parityMismatches   prometheus.Counter
	parityUnverified   prometheus.Counter
	paritySampledOut   prometheus.Counter
	indexErrors        prometheus.Counter
	unresolvedRemovals prometheus.Counter
	recoveryClears     prometheus.Counter
	untrustedPods      prometheus.Gauge
	batchDuration      prometheus.Histogram
}

// NewMetrics creates the metrics and registers them on reg (nil = unregistered,
// e.g. in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "kvindexd"
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "events_applied_total",
		Help: "KV-cache events applied to the index, by event type.",
	}, []string{"type"})
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
	}
	m := &Metrics{
		blocksStored:       c("blocks_stored_total", "Block keys added to the index by BlockStored events."),
		blocksRemoved:      c("blocks_removed_total", "Block keys removed from the index by BlockRemoved events."),
		blocksUnkeyed:      c("blocks_unkeyed_total", "Stored blocks not indexed because no usable key exists (SGLang block without token ids or with an unknown parent)."),
		parityMatches:      c("parity_matches_total", "Blocks whose engine hash equals the key computed from their token ids."),
		parityMismatches:   c("parity_mismatches_total", "Blocks whose engine hash differs from the key computed from their token ids (indexed under the computed key)."),
		parityUnverified:   c("parity_unverified_total", "Blocks whose hash could not be checked (no token ids, parent digest unknown, extra keys unknown)."),
		paritySampledOut:   c("parity_sampled_out_total", "Blocks of pods with a proven configuration indexed without re-hashing (parity sampling)."),
		indexErrors:        c("index_errors_total", "Index operations that failed; the pod is marked untrusted and rebuilt."),
		unresolvedRemovals: c("unresolved_removals_total", "Removed engine hashes of aliased pods (mismatch or SGLang) with no alias to translate them."),
		recoveryClears:     c("recovery_clears_total", "Pods cleared to recover from an index error."),
		untrustedPods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "untrusted_pods",
			Help: "Pods whose index state is untrusted after an index error."}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "apply_batch_seconds",
			Help: "Time to apply one engine batch to the index.", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)}),
	}
	for _, k := range []EventKind{BlockStored, BlockRemoved, AllBlocksCleared} {
		m.events[k] = events.WithLabelValues(k.String())
	}
	if reg != nil {
		reg.MustRegister(events, m.blocksStored, m.blocksRemoved, m.blocksUnkeyed, m.parityMatches,
			m.parityMismatches, m.parityUnverified, m.paritySampledOut, m.indexErrors, m.unresolvedRemovals,
			m.recoveryClears, m.untrustedPods, m.batchDuration)
	}
	return m
}

// flush adds one batch's counts.
func (m *Metrics) flush(d *batchDelta, took time.Duration) {
	for k := BlockStored; k <= AllBlocksCleared; k++ {
		if d.events[k] > 0 {
			m.events[k].Add(float64(d.events[k]))
		}
	}
	add := func(c prometheus.Counter, v uint64) {
		if v > 0 {
			c.Add(float64(v))
		}
	}
	add(m.blocksStored, d.stored)
	add(m.blocksRemoved, d.removed)
	add(m.blocksUnkeyed, d.unkeyed)
	add(m.parityMatches, d.matches)
	add(m.parityMismatches, d.mismatches)
	add(m.parityUnverified, d.unverified)
	add(m.paritySampledOut, d.sampledOut)
	add(m.indexErrors, d.indexErrors)
	add(m.unresolvedRemovals, d.unresolved)
	add(m.recoveryClears, d.recoveries)
	m.batchDuration.Observe(took.Seconds())
}
