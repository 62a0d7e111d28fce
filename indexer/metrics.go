package indexer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer/routing"
)

// metrics are the score pipeline's own series plus a collector that reads
// the index and applier statistics at scrape time (no double bookkeeping).
// Names keep the daemon's kvindexd_ prefix: they are read by the same
// dashboards as before the indexer owned them.
type metrics struct {
	lookup prometheus.Histogram
	tokens prometheus.Histogram
	// picks by [policy number][reason], resolved once
	picks      [][routing.NumReasons]prometheus.Counter
	specBlocks prometheus.Counter
	// P/D picks by disaggregation decision, and those that named a kv_source
	pdSplits   [routing.NumSplits]prometheus.Counter
	pdSources  prometheus.Counter
	specErrors prometheus.Counter
	// sharedModels counts models interned on the read path because the
	// shared index (Redis) holds them though this process saw no event.
	sharedModels prometheus.Counter
	// indexLost counts the backend's reports that it lost entries, by
	// reason (redisindex: restart, eviction, flush).
	indexLost *prometheus.CounterVec
	// evictedPods counts pods marked incomplete because the index evicted
	// their blocks for capacity.
	evictedPods prometheus.Counter
	// storageRefused counts batches dropped because their topic named a
	// storage medium no --storage-readers entry configures (storage.go).
	storageRefused prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, ix *Indexer) (*metrics, error) {
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
		sharedModels: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_shared_models_interned_total",
			Help: "Models this daemon learned from the shared index on the read path (no event for them received here).",
		}),
		storageRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_storage_claims_refused_total",
			Help: "Event batches dropped because their topic's pod slot names a storage medium (SHARED_STORAGE, OBJECT_STORE) that --storage-readers does not configure.",
		}),
	}
	picks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindexd_picks_total",
		Help: "Pick decisions by policy and reason.",
	}, []string{"policy", "reason"})
	m.picks = make([][routing.NumReasons]prometheus.Counter, len(ix.pick.order))
	for i, p := range ix.pick.order {
		for r := range routing.NumReasons {
			m.picks[i][r] = picks.WithLabelValues(p.Name(), r.String())
		}
	}
	splits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindexd_pick_pd_total",
		Help: "P/D picks (some candidate had a role) by disaggregation decision: disaggregated, few-uncached-tokens, prefill-pool-busy, no-prefill-pool.",
	}, []string{"decision"})
	for sp := range routing.NumSplits {
		m.pdSplits[sp] = splits.WithLabelValues(sp.String())
	}
	m.pdSources = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_pick_kv_sources_total",
		Help: "P/D picks that named a kv_source: a pod holding more of the request's leading blocks than the chosen pods.",
	})
	m.specBlocks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_pick_speculative_blocks_total",
		Help: "Matched blocks that came from speculative entries (picked, not yet confirmed by events).",
	})
	m.specErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_pick_speculative_errors_total",
		Help: "Failed reads or writes of the shared speculative store; the pick went on without speculation.",
	})

	m.indexLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvindexd_index_lost_total",
		Help: "Times the index backend lost entries behind the daemon (Redis restart, eviction, flush); every pod's stream is then incomplete (index_lost).",
	}, []string{"reason"})
	m.evictedPods = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvindexd_capacity_evicted_pods_total",
		Help: "Times the in-memory index evicted a pod's blocks to stay within --capacity; the pod's stream is then incomplete (evicted_for_capacity) until an engine snapshot, clear or restart.",
	})
	stale := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindexd_snapshot_stale_pods",
		Help: "Pods loaded from a snapshot that are not served until their stream resumes.",
	}, func() float64 { return float64(ix.StalePods()) })
	// Restored pods are decided by kvevents (ResumeFrom), which counts them.
	restoreClears := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kvindexd_snapshot_restart_clears_total",
		Help: "Pods loaded from a snapshot and cleared because their engine restarted since (first seq at or below the snapshot's).",
	}, func() float64 {
		if ix.sub == nil {
			return 0
		}
		return float64(ix.sub.RestoreClears())
	})
	for _, c := range []prometheus.Collector{m.lookup, m.tokens, picks, splits, m.pdSources, m.specBlocks, m.specErrors, m.sharedModels, m.storageRefused, restoreClears, m.indexLost, m.evictedPods, stale, &statsCollector{indexer: ix}, keyCacheCollector{ix.keys}, qualityCollector{ix.quality}, ix.quality.shareVec} {
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

	holdLabels        = []string{"store"}
	descHoldEntries   = prometheus.NewDesc("kvindexd_pick_assumed_entries", "(block, pod) entries assumed from picks: store=speculative (pods with events, in-process store only) or history (pods without events).", holdLabels, nil)
	descHoldEvictions = prometheus.NewDesc("kvindexd_pick_assumed_evictions_total", "Live assumed entries dropped at the capacity bound.", holdLabels, nil)
	descPodsOmitted   = prometheus.NewDesc("kvindexd_pod_series_omitted", "Pods (and DP ranks) beyond the first MaxPodSeries, in name order, whose kvindexd_pod_* series are not exported (see /v1/pods).", nil, nil)
)

// MaxPodSeries bounds the pods with kvindexd_pod_* series: ten series per pod
// with names up to 253 bytes would make a 10k-pod scrape ~40 MB.
const MaxPodSeries = 1000

// statsCollector reads the live index and applier statistics at scrape time.
type statsCollector struct{ indexer *Indexer }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIndexEntries, descIndexKeys, descIndexEvicted, descIndexExpired,
		descPodEvents, descPodStored, descPodRemoved, descPodClears, descPodParityMatch, descPodParityMismatch,
		descPodParityUnver, descPodIndexErrors, descPodUntrusted, descPodLastEvent, descHoldEntries, descHoldEvictions, descPodsOmitted} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.indexer.idx.Stats()
	ch <- prometheus.MustNewConstMetric(descIndexEntries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(descIndexKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(descIndexEvicted, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descIndexExpired, prometheus.CounterValue, float64(st.Expired))

	for _, h := range []struct {
		name string
		m    *holdMap
	}{{"speculative", c.indexer.pick.specMem}, {"history", c.indexer.pick.hist}} {
		if h.m != nil {
			ch <- prometheus.MustNewConstMetric(descHoldEntries, prometheus.GaugeValue, float64(h.m.len()), h.name)
			ch <- prometheus.MustNewConstMetric(descHoldEvictions, prometheus.CounterValue, float64(h.m.evictions.Load()), h.name)
		}
	}

	pods := c.indexer.applier.PodStats()
	ch <- prometheus.MustNewConstMetric(descPodsOmitted, prometheus.GaugeValue, float64(max(len(pods)-MaxPodSeries, 0)))
	for _, p := range pods[:min(len(pods), MaxPodSeries)] {
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
