package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
)

// metrics are the API's request series plus a collector that reads
// readiness and the subscriber statistics at scrape time (no double
// bookkeeping); the index and per-pod series belong to the indexer. Names
// use the kvindexd_ prefix so they never collide with the series the kvindex
// and kvevents packages register on the same registry.
type metrics struct {
	requests *prometheus.CounterVec
	// requestCounters caches the children of requests by [input][code] so
	// the hot path does no label lookup.
	requestCounters [indexer.NumInputKinds][codes.Unauthenticated + 1]prometheus.Counter
	duration        *prometheus.HistogramVec
	durations       [indexer.NumInputKinds]prometheus.Observer
	// headerBudgetRejected counts HTTP requests answered 503 because the
	// header bytes of the requests in progress were at the budget.
	headerBudgetRejected prometheus.Counter
	// bodyBudgetRejected and bodyInflight are the request body budget's.
	bodyBudgetRejected prometheus.Counter
	bodyInflight       prometheus.Gauge
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
		headerBudgetRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_http_header_budget_rejected_total",
			Help: "HTTP requests answered 503, gRPC calls refused Unavailable, and connections closed before their headers were parsed, because the headers in progress were at --http-header-budget-bytes.",
		}),
		bodyBudgetRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_http_body_budget_rejected_total",
			Help: "HTTP requests answered 503 because their body found no room in --http-body-budget-bytes within 2 s.",
		}),
		bodyInflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindexd_http_body_inflight_bytes",
			Help: "Bytes of --http-body-budget-bytes held by request bodies over 1 MiB being read or served.",
		}),
	}
	for k := range indexer.NumInputKinds {
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			m.requestCounters[k][c] = m.requests.WithLabelValues(k.String(), c.String())
		}
		m.durations[k] = m.duration.WithLabelValues(k.String())
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.headerBudgetRejected, m.bodyBudgetRejected, m.bodyInflight, &statsCollector{server: s}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerBuildInfo adds kvindexd_build_info{version,commit,go_version} 1,
// the usual Prometheus way to expose a version: joined on other series
// (`* on(instance) group_left(version)`) it labels them with it.
func registerBuildInfo(reg *prometheus.Registry, b BuildInfo) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "kvindexd_build_info",
		Help:        "Always 1; the labels are the version, VCS commit and Go version of the running binary.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion},
	})
	g.Set(1)
	return reg.Register(g)
}

func (m *metrics) observeRequest(k indexer.InputKind, c codes.Code, d time.Duration) {
	if c > codes.Unauthenticated {
		c = codes.Unknown
	}
	m.requestCounters[k][c].Inc()
	m.durations[k].Observe(d.Seconds())
}

var (
	descReady = prometheus.NewDesc("kvindexd_ready", "1 when the index is healthy and the daemon serves scores.", nil, nil)

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
type statsCollector struct{ server *Server }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descStreamSeq, descStreamBatches, descStreamGaps, descStreamMissed, descStreamRestarts, descStreamDecodeErr,
		descStreamOverflows, descEndpointConnected} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.server
	ready, _ := s.Ready()
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(ready))

	if s.cfg.Subscriber != nil {
		streams := s.cfg.Subscriber.Streams()
		// as many streams as the indexer exports pods; /v1/pods lists all
		for _, st := range streams[:min(len(streams), indexer.MaxPodSeries)] {
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
