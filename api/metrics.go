package api

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// metrics are the API's own series plus a collector that reads the index,
// applier and subscriber statistics at scrape time (no double bookkeeping).
// Names use the kvindexd_ prefix so they never collide with the series the
// kvindex and kvevents packages register on the same registry.
type metrics struct {
	requests *prometheus.CounterVec
	// requestCounters caches the children of requests by [input][code] so
	// the hot path does no label lookup.
	requestCounters [len(inputKindNames)][codes.Unauthenticated + 1]prometheus.Counter
	duration        *prometheus.HistogramVec
	durations       [len(inputKindNames)]prometheus.Observer
	lookup          prometheus.Histogram
	tokens          prometheus.Histogram
}

func newMetrics(reg *prometheus.Registry, s *Server) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_score_requests_total",
			Help: "Score requests by input kind (token_ids, block_hashes, prompt) and gRPC status code.",
		}, []string{"input", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvindexd_score_duration_seconds",
			Help:    "Score request time inside the daemon (tokenize + keys + lookup), by input kind.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2.5, 16),
		}, []string{"input"}),
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
	for i := range inputKindNames {
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			m.requestCounters[i][c] = m.requests.WithLabelValues(inputKindNames[i], c.String())
		}
		m.durations[i] = m.duration.WithLabelValues(inputKindNames[i])
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.lookup, m.tokens, &statsCollector{s: s}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observeRequest(k inputKind, c codes.Code, d time.Duration) {
	if c > codes.Unauthenticated {
		c = codes.Unknown
	}
	m.requestCounters[k][c].Inc()
	m.durations[k].Observe(d.Seconds())
}

var (
	descIndexEntries = prometheus.NewDesc("kvindexd_index_entries", "(block, holder) entries in the index.", nil, nil)
	descIndexKeys    = prometheus.NewDesc("kvindexd_index_keys", "Distinct (model, block key) entries in the index.", nil, nil)
	descIndexEvicted = prometheus.NewDesc("kvindexd_index_evictions_total", "Entries dropped at the capacity bound.", nil, nil)
	descIndexExpired = prometheus.NewDesc("kvindexd_index_expired_total", "Entries dropped by the TTL safety net (Redis).", nil, nil)
	descReady        = prometheus.NewDesc("kvindexd_ready", "1 when the index is healthy and the daemon serves scores.", nil, nil)

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

	streamLabels        = []string{"pod", "dp_rank", "endpoint"}
	descStreamSeq       = prometheus.NewDesc("kvindexd_stream_last_seq", "Last sequence number seen per stream.", streamLabels, nil)
	descStreamBatches   = prometheus.NewDesc("kvindexd_stream_batches_total", "Batches received per stream.", streamLabels, nil)
	descStreamGaps      = prometheus.NewDesc("kvindexd_stream_seq_gaps_total", "Forward sequence gaps per stream.", streamLabels, nil)
	descStreamMissed    = prometheus.NewDesc("kvindexd_stream_missed_batches_total", "Batches skipped by forward sequence gaps per stream, before any replay.", streamLabels, nil)
	descStreamRestarts  = prometheus.NewDesc("kvindexd_stream_restarts_total", "Backward sequence jumps (engine restarts) per stream.", streamLabels, nil)
	descStreamDecodeErr = prometheus.NewDesc("kvindexd_stream_decode_errors_total", "Malformed events dropped per stream (an undecodable message has no stream: see kvindexd_kvevents_decode_errors_total).", streamLabels, nil)
	descStreamOverflows = prometheus.NewDesc("kvindexd_stream_overflows_total", "Batches dropped because the pod's queue was full.", streamLabels, nil)

	descEndpointConnected = prometheus.NewDesc("kvindexd_endpoint_connected", "1 when the subscriber is connected to (or bound on) the endpoint.", []string{"address", "pod"}, nil)
)

// statsCollector reads the live statistics at scrape time.
type statsCollector struct{ s *Server }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIndexEntries, descIndexKeys, descIndexEvicted, descIndexExpired, descReady,
		descPodEvents, descPodStored, descPodRemoved, descPodClears, descPodParityMatch, descPodParityMismatch,
		descPodParityUnver, descPodIndexErrors, descPodUntrusted, descPodLastEvent,
		descStreamSeq, descStreamBatches, descStreamGaps, descStreamMissed, descStreamRestarts, descStreamDecodeErr,
		descStreamOverflows, descEndpointConnected} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	st := s.cfg.Index.Stats()
	ch <- prometheus.MustNewConstMetric(descIndexEntries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(descIndexKeys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(descIndexEvicted, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descIndexExpired, prometheus.CounterValue, float64(st.Expired))
	ready, _ := s.Ready()
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(ready))

	if s.cfg.Applier != nil {
		for _, p := range s.cfg.Applier.PodStats() {
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
			ch <- prometheus.MustNewConstMetric(descPodUntrusted, prometheus.GaugeValue, b2f(p.Untrusted), l...)
			if !p.LastEvent.IsZero() {
				ch <- prometheus.MustNewConstMetric(descPodLastEvent, prometheus.GaugeValue, float64(p.LastEvent.UnixNano())/1e9, l...)
			}
		}
	}
	if s.cfg.Subscriber != nil {
		for _, st := range s.cfg.Subscriber.Streams() {
			l := []string{st.Pod, strconv.Itoa(st.DPRank), st.Endpoint}
			ch <- prometheus.MustNewConstMetric(descStreamSeq, prometheus.GaugeValue, float64(st.LastSeq), l...)
			ch <- prometheus.MustNewConstMetric(descStreamBatches, prometheus.CounterValue, float64(st.Batches), l...)
			ch <- prometheus.MustNewConstMetric(descStreamGaps, prometheus.CounterValue, float64(st.SeqGaps), l...)
			ch <- prometheus.MustNewConstMetric(descStreamMissed, prometheus.CounterValue, float64(st.MissedBatches), l...)
			ch <- prometheus.MustNewConstMetric(descStreamRestarts, prometheus.CounterValue, float64(st.Restarts), l...)
			ch <- prometheus.MustNewConstMetric(descStreamDecodeErr, prometheus.CounterValue, float64(st.DecodeErrors), l...)
			ch <- prometheus.MustNewConstMetric(descStreamOverflows, prometheus.CounterValue, float64(st.Overflows), l...)
		}
		for _, ep := range s.cfg.Subscriber.Endpoints() {
			ch <- prometheus.MustNewConstMetric(descEndpointConnected, prometheus.GaugeValue, b2f(ep.Connected || ep.Bound), ep.Address, ep.Pod)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// podBlocks asks the index how many blocks a pod holds; -1 when it cannot
// say (index down), so a listing still answers.
func (s *Server) podBlocks(ctx context.Context, name string, rank int) int64 {
	id, ok := s.cfg.Interner.LookupPod(name, rank)
	if !ok {
		return 0
	}
	n, err := s.cfg.Index.PodBlocks(ctx, id)
	if err != nil {
		return -1
	}
	return n
}
