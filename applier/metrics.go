package applier

import (
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the applier's and the index's Prometheus metrics (namespace
// "kvindex"). Labelled counters are resolved to their children once, here, so
// the apply path never does a label lookup. Per-pod series and the index's own
// counters are not duplicated here: the indexer package exports them at scrape
// time from Applier.PodStats and Index.Stats (kvindexd_pod_*, kvindexd_index_*).
type Metrics struct {
	events             [event.BlockSnapshot + 1]prometheus.Counter // by event.Kind
	blocksStored       prometheus.Counter
	blocksRemoved      prometheus.Counter
	blocksUnkeyed      prometheus.Counter
	parityMatches      prometheus.Counter
	parityMismatches   prometheus.Counter
	parityUnverified   [numUnverifiedReasons]prometheus.Counter // by reason
	blocksSkipped      [2]prometheus.Counter                    // remote, group
	copiesKept         prometheus.Counter
	tableEvictions     prometheus.Counter
	paritySampledOut   prometheus.Counter
	indexErrors        prometheus.Counter
	unresolvedRemovals prometheus.Counter
	recoveryClears     prometheus.Counter
	untrustedPods      prometheus.Gauge
	holdTableBytes     prometheus.Gauge // tables.go
	batchDuration      prometheus.Histogram
	limits             limitMetrics   // limits.go
	sessions           sessionMetrics // sessions.go
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
		blocksStored:     c("blocks_stored_total", "Block keys added to the index by BlockStored events."),
		blocksRemoved:    c("blocks_removed_total", "Block keys removed from the index by BlockRemoved events."),
		blocksUnkeyed:    c("blocks_unkeyed_total", "Stored blocks not indexed because no usable key exists (a mismatching block whose alias table was refused by the alias-table limit)."),
		parityMatches:    c("parity_matches_total", "Blocks whose engine hash equals the key computed from their token ids."),
		parityMismatches: c("parity_mismatches_total", "Blocks whose engine hash differs from the key computed from their token ids (indexed under the computed key)."),
		copiesKept: c("copies_kept_total", "Block removals that left the block indexed because another physical copy remains "+
			"(remaining_copy_counts, or kvindex's own count)."),
		tableEvictions: c("hold_table_evictions_total", "Entries of the per-pod copy-count and group-mask tables replaced at capacity "+
			"(precision lost in the safe direction: a block may be unindexed early)."),
		paritySampledOut:   c("parity_sampled_out_total", "Blocks of pods with a proven configuration indexed without re-hashing (parity sampling)."),
		indexErrors:        c("index_errors_total", "Index operations that failed; the pod is marked untrusted and rebuilt."),
		unresolvedRemovals: c("unresolved_removals_total", "Removed engine hashes of aliased pods (mismatch or SGLang) with no alias to translate them."),
		recoveryClears:     c("recovery_clears_total", "Pods cleared to recover from an index error."),
		untrustedPods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "untrusted_pods",
			Help: "Pods whose index state is untrusted after an index error."}),
		holdTableBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "hold_table_bytes",
			Help: "Memory of the per-pod copy-count and group-mask tables (each grows with the blocks its pod stores, up to " +
				"65,536 entries; they stop growing at 256 MiB together, a new table takes 768 bytes)."}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "apply_batch_seconds",
			Help: "Time to apply one engine batch to the index.", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10)}),
	}
	limits, limitCollectors := newLimitMetrics(ns)
	m.limits = limits
	var sessionCollectors []prometheus.Collector
	m.sessions, sessionCollectors = newSessionMetrics(ns)
	limitCollectors = append(limitCollectors, sessionCollectors...)
	for _, k := range []event.Kind{event.BlockStored, event.BlockRemoved, event.AllBlocksCleared, event.BlockSnapshot} {
		m.events[k] = events.WithLabelValues(k.String())
	}
	unverified := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "parity_unverified_total",
		Help: "Blocks indexed under the engine's hash because it could not be recomputed, by reason (no_tokens, token_count, " +
			"partial_block, block_size, parent_unknown, extra_keys, lora_name_missing, bigram)."}, []string{"reason"})
	for r := unverifiedNoTokens; r < numUnverifiedReasons; r++ {
		m.parityUnverified[r] = unverified.WithLabelValues(unverifiedNames[r])
	}
	skipped := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "blocks_not_indexed_total",
		Help: "Blocks of events deliberately not indexed as the pod's: locality REMOTE (reason=remote), or a KV-cache group " +
			"that does not bound a prefix match: sliding window, mamba, other (reason=group)."}, []string{"reason"})
	m.blocksSkipped[0], m.blocksSkipped[1] = skipped.WithLabelValues("remote"), skipped.WithLabelValues("group")
	if reg != nil {
		reg.MustRegister(events, m.blocksStored, m.blocksRemoved, m.blocksUnkeyed, m.parityMatches,
			m.parityMismatches, unverified, skipped, m.copiesKept, m.tableEvictions, m.paritySampledOut, m.indexErrors, m.unresolvedRemovals,
			m.recoveryClears, m.untrustedPods, m.holdTableBytes, m.batchDuration)
		reg.MustRegister(limitCollectors...)
	}
	return m
}

// flush adds one batch's counts.
func (m *Metrics) flush(d *batchDelta, took time.Duration) {
	for k := event.BlockStored; k <= event.BlockSnapshot; k++ {
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
	for r := unverifiedNoTokens; r < numUnverifiedReasons; r++ {
		add(m.parityUnverified[r], d.unverifiedBy[r])
	}
	add(m.blocksSkipped[0], d.remote)
	add(m.blocksSkipped[1], d.groupSkipped)
	add(m.copiesKept, d.copiesKept)
	add(m.tableEvictions, d.tableEvictions)
	add(m.paritySampledOut, d.sampledOut)
	add(m.indexErrors, d.indexErrors)
	add(m.unresolvedRemovals, d.unresolved)
	add(m.recoveryClears, d.recoveries)
	m.batchDuration.Observe(took.Seconds())
}
