package indexer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the score pipeline's own series plus a collector that reads
// the index and applier statistics at scrape time (no double bookkeeping).
// Names keep the daemon's kvindexd_ prefix: they are read by the same
// dashboards as before the indexer owned them.
type metrics struct {
	lookup prometheus.Histogram
	tokens prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry, x *Indexer) (*metrics, error) {
	m := &metrics{
		lookup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindexd_score_lookup_seconds",
			Help:    "Index lookup + scoring time per request.",
			Buckets: prometheus.ExponentialBuckets(5e-7, 2.5, 16),
		}),
		tokens: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindexd_score_tokens",
			Help:    "Tokens per score request (token_ids and prompt inputs).",
			Buckets: prometheus.ExponentialBuckets(16, 2, 14),
		}),
	}
	for _, c := range []prometheus.Collector{m.lookup, m.tokens, &statsCollector{x: x}, keyCacheCollector{x.keys}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

var (
	descIndexEntries = prometheus.NewDesc("kvindexd_index_entries", "(block, holder) entries in the index.", nil, nil)
	descIndexKeys    = prometheus.NewDesc("kvindexd_index_keys", "Distinct (model, block key) entries in the index.", nil, nil)
	descIndexEvicted = prometheus.NewDesc("kvindexd_index_evictions_total", "Entries dropped at the capacity bound.", nil, nil)
	descIndexExpired = prometheus.NewDesc("kvindexd_index_expired_total", "Entries dropped by the TTL safety net (Redis).", nil, nil)

	podLabels             = []string{"pod", "dp_rank", "model"}
	descPodEvents         = prometheus.NewDesc("kvindexd_pod_events_applied_total", "Events applied per pod and DP rank.", podLabels, nil)
	descPodStored         = prometheus.NewDesc("kvindexd_pod_blocks_stored_total", "Blocks stored per pod and DP rank.", podLabels, nil)
	descPodRemoved        = prometheus.NewDesc("kvindexd_pod_blocks_removed_total", "Blocks removed per pod and DP rank.", podLabels, nil)
	descPodClears         = prometheus.NewDesc("kvindexd_pod_clears_total", "Whole-pod clears (AllBlocksCleared, restart, removal, recovery).", podLabels, nil)
	descPodParityMatch    = prometheus.NewDesc("kvindexd_pod_parity_matches_total", "Engine block hashes equal to our recomputation.", podLabels, nil)
	descPodParityMismatch = prometheus.NewDesc("kvindexd_pod_parity_mismatches_total", "Engine block hashes that differ from our recomputation (seed, algorithm or block size differ).", podLabels, nil)
	descPodParityUnver    = prometheus.NewDesc("kvindexd_pod_parity_unverified_total", "Blocks whose hash could not be recomputed (no token ids or unknown parent).", podLabels, nil)
	descPodIndexErrors    = prometheus.NewDesc("kvindexd_pod_index_errors_total", "Index write failures while applying this pod's events.", podLabels, nil)
	descPodUntrusted      = prometheus.NewDesc("kvindexd_pod_untrusted", "1 while the pod's entries are not trusted (reset pending after an index failure).", podLabels, nil)
	descPodLastEvent      = prometheus.NewDesc("kvindexd_pod_last_event_timestamp_seconds", "Time the last event of the pod was applied.", podLabels, nil)
)

// statsCollector reads the live index and applier statistics at scrape time.
type statsCollector struct{ x *Indexer }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIndexEntries, descIndexKeys, descIndexEvicted, descIndexExpired,
		descPodEvents, descPodStored, descPodRemoved, descPodClears, descPodParityMatch, descPodParityMismatch,
		descPodParityUnver, descPodIndexErrors, descPodUntrusted, descPodLastEvent} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.x.idx.Stats()
	ch <- prometheus.MustNewConstMetric(descIndexEntries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(descIndexKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(descIndexEvicted, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descIndexExpired, prometheus.CounterValue, float64(st.Expired))

	for _, p := range c.x.applier.PodStats() {
		l := []string{p.Pod, strconv.Itoa(p.DPRank), p.Model}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
		}
		counter(descPodEvents, p.EventsApplied)
		counter(descPodStored, p.BlocksStored)
		counter(descPodRemoved, p.BlocksRemoved)
		counter(descPodClears, p.Clears)
		counter(descPodParityMatch, p.ParityMatches)
		counter(descPodParityMismatch, p.ParityMismatches)
		counter(descPodParityUnver, p.ParityUnverified)
		counter(descPodIndexErrors, p.IndexErrors)
		untrusted := 0.0
		if p.Untrusted {
			untrusted = 1
		}
		ch <- prometheus.MustNewConstMetric(descPodUntrusted, prometheus.GaugeValue, untrusted, l...)
		if !p.LastEvent.IsZero() {
			ch <- prometheus.MustNewConstMetric(descPodLastEvent, prometheus.GaugeValue, float64(p.LastEvent.UnixNano())/1e9, l...)
		}
	}
}
