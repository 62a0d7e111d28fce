package kvevents

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the kvevents Prometheus series, namespace "kvindex",
// subsystem "kvevents".
type Metrics struct {
	MessagesReceived   *prometheus.CounterVec // by socket: bind | connect
	BatchesDecoded     *prometheus.CounterVec // by engine
	EventsDecoded      *prometheus.CounterVec // by engine, type
	DecodeErrors       *prometheus.CounterVec // by engine, level: event | batch
	DroppedFrames      *prometheus.CounterVec // by reason
	QueueOverflows     prometheus.Counter
	QueueWaits         prometheus.Counter // batches a reader waited to queue (backpressure)
	QueueWaitSeconds   prometheus.Counter
	SeqGaps            prometheus.Counter
	MissedBatches      prometheus.Counter
	Restarts           prometheus.Counter
	Replays            *prometheus.CounterVec // by result: ok | partial | error
	ReplayedBatches    prometheus.Counter
	SyntheticClears    *prometheus.CounterVec // by reason: restart | overflow | endpoint_removed
	ConnectedEndpoints prometheus.Gauge
	ShutdownDropped    prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (nil = not
// registered, for tests and embedders).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "kvindexd", "kvevents"
	m := &Metrics{
		MessagesReceived: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "messages_received_total", Help: "ZeroMQ messages received, by socket kind (bind or connect)."}, []string{"socket"}),
		BatchesDecoded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "batches_decoded_total", Help: "Event batches decoded, by engine."}, []string{"engine"}),
		EventsDecoded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "events_decoded_total", Help: "Events decoded, by engine and type."}, []string{"engine", "type"}),
		DecodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "decode_errors_total", Help: "Malformed events (level=event: that event dropped) and messages (level=batch: message dropped)."}, []string{"engine", "level"}),
		DroppedFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "dropped_frames_total", Help: "Messages dropped before decoding, by reason."}, []string{"reason"}),
		QueueOverflows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_overflows_total", Help: "Batches dropped because their worker queue was full (the pod is cleared before its next batch)."}),
		QueueWaits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_waits_total", Help: "Batches whose reader waited for room in a full worker queue (backpressure on the socket)."}),
		QueueWaitSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_wait_seconds_total", Help: "Time readers spent waiting for room in full worker queues."}),
		SeqGaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "seq_gaps_total", Help: "Forward jumps in a stream's sequence numbers."}),
		MissedBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "missed_batches_total", Help: "Batches skipped by forward sequence jumps (before any replay)."}),
		Restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "restarts_total", Help: "Backward sequence jumps (engine restarts); the pod is cleared."}),
		Replays: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "replays_total", Help: "Replay requests after a gap, by result (ok, partial, error)."}, []string{"result"}),
		ReplayedBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "replayed_batches_total", Help: "Missed batches recovered through replay."}),
		SyntheticClears: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "synthetic_clears_total", Help: "AllBlocksCleared events kvevents delivered itself, by reason."}, []string{"reason"}),
		ConnectedEndpoints: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "connected_endpoints", Help: "Connect-topology endpoints currently connected."}),
		ShutdownDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "shutdown_dropped_batches_total", Help: "Batches still queued when the subscriber stopped and not applied within the drain timeout."}),
	}
	if reg != nil {
		reg.MustRegister(m.MessagesReceived, m.BatchesDecoded, m.EventsDecoded, m.DecodeErrors, m.DroppedFrames,
			m.QueueOverflows, m.QueueWaits, m.QueueWaitSeconds, m.SeqGaps, m.MissedBatches, m.Restarts, m.Replays, m.ReplayedBatches,
			m.SyntheticClears, m.ConnectedEndpoints, m.ShutdownDropped)
	}
	return m
}
