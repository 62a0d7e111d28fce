package discovery

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	changes *prometheus.CounterVec
	errors  *prometheus.CounterVec
	skipped *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, d *Discoverer) (*metrics, error) {
	m := &metrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_discovery_endpoint_changes_total",
			Help: "Endpoints subscribed (op=add) and unsubscribed with their pods cleared (op=remove) by pod discovery.",
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_discovery_errors_total",
			Help: "Subscriber calls of pod discovery that failed, by op (add is retried on the next resync).",
		}, []string{"op"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_discovery_skipped_total",
			Help: "Ready pods not subscribed, by reason: invalid (a bad kvindex.io/* annotation) or max_pods (the limit is reached).",
		}, []string{"reason"}),
	}
	for _, op := range []string{"add", "remove"} {
		m.changes.WithLabelValues(op)
		m.errors.WithLabelValues(op)
	}
	for _, r := range []string{"invalid", "max_pods"} {
		m.skipped.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	pods := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindexd_discovery_pods",
		Help: "Pods currently subscribed by pod discovery.",
	}, func() float64 { return float64(d.Pods()) })
	for _, c := range []prometheus.Collector{m.changes, m.errors, m.skipped, pods} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
