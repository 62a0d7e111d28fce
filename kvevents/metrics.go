package kvevents

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// Metrics are the kvevents Prometheus series, namespace "kvindexd",
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
	CatchUps           *prometheus.CounterVec // by result: ok | error
	CaughtUpBatches    prometheus.Counter
	Snapshots          *prometheus.CounterVec // by result: ok | stale | error
	IgnoredFields      *prometheus.CounterVec // by engine
	UnknownMedia       prometheus.Counter
	PackedEvents       prometheus.Counter
	ReplayedBatches    prometheus.Counter
	Rebuilds           *prometheus.CounterVec // by result: complete | replay_window | failed | superseded
	RebuiltBatches     prometheus.Counter
	SyntheticClears    *prometheus.CounterVec // by reason: restart | overflow | endpoint_removed | expired | rebuild | restored | index_error
	ConnectedEndpoints prometheus.Gauge
	ShutdownDropped    prometheus.Counter
	// ZMQ counts what the transport did with its peers, shared by every
	// socket of the Subscriber; exported as kvindexd_kvevents_zmq_*.
	ZMQ *zmtp.Counters

	limits limitMetrics
	// the subscriber whose state the gauges read (watch); set once
	sub atomic.Pointer[Subscriber]
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
		CatchUps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "catch_ups_total", Help: "Replay-buffer requests at (re)connect of an endpoint with a replay address, by result (ok, error)."}, []string{"result"}),
		CaughtUpBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "caught_up_batches_total", Help: "Batches received from replay buffers at (re)connect and applied."}),
		Snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "snapshots_total", Help: "Engine snapshots (SGLang snapshot-v1) asked for after batches were lost beyond repair, by result (ok, stale, error)."}, []string{"result"}),
		IgnoredFields: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "ignored_fields_total", Help: "Optional event fields whose value could not be interpreted and was skipped; their events are kept, by engine."}, []string{"engine"}),
		UnknownMedia: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "unknown_media_total", Help: "Events whose medium is not in kvindex's media table (indexed as external storage)."}),
		PackedEvents: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "packed_events_total", Help: "Events that arrived as msgpack bytes holding an encoded event (llm-d storage-tier publisher) and were decoded."}),
		ReplayedBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "replayed_batches_total", Help: "Missed batches recovered through replay after a gap."}),
		Rebuilds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "rebuilds_total", Help: "Rebuilds of a pod the index lost from its engine's replay buffer (endpoints with a replay and no snapshot address), " +
				"by result: complete (replayed from the lifetime's start to the last batch seen), replay_window (the buffer no longer held the start: " +
				"the pod stays incomplete), failed (the replay did not reach the last batch seen: the pod keeps its reason), superseded (the index " +
				"lost entries again meanwhile: rebuilt again)."}, []string{"result"}),
		RebuiltBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "rebuilt_batches_total", Help: "Batches queued by rebuilds from replay buffers."}),
		SyntheticClears: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "synthetic_clears_total", Help: "AllBlocksCleared events kvevents delivered itself, by reason."}, []string{"reason"}),
		ConnectedEndpoints: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "connected_endpoints", Help: "Connect-topology endpoints currently connected."}),
		ShutdownDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "shutdown_dropped_batches_total", Help: "Batches still queued when the subscriber stopped and not applied within the drain timeout."}),
		ZMQ: &zmtp.Counters{},
	}
	m.limits = limitMetrics{
		expired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "streams_expired_total", Help: "Streams silent beyond --pod-expiry, cleared from the index and forgotten."}),
		logSuppressed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "log_lines_suppressed_total", Help: "Warning lines not written because their source (endpoint, pod) exceeded its log rate."}),
	}
	gauge := func(name, help string, v func(*Subscriber) float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, func() float64 {
			if s := m.sub.Load(); s != nil {
				return v(s)
			}
			return 0
		})
	}
	m.limits.streams = gauge("streams", "(pod, dp rank) streams tracked (bounded by --max-streams).",
		func(s *Subscriber) float64 { return float64(s.limits.nStream.Load()) })
	m.limits.models = gauge("models", "Distinct model names of the tracked streams (bounded by --max-models).",
		func(s *Subscriber) float64 { return float64(s.limits.nModel.Load()) })
	m.limits.queuedBytes = gauge("queued_bytes", "Estimated memory of the decoded batches waiting for the workers (bounded by the queue budget).",
		func(s *Subscriber) float64 { return float64(s.dispatcher.budget.used.Load()) })
	m.limits.rebuildsQueued = gauge("rebuilds_queued", "Streams waiting for a rebuild from their engine's replay buffer (each at most once; "+
		"at most 4 rebuilds run at a time).",
		func(s *Subscriber) float64 { return float64(s.rebuildsQueued()) })
	m.limits.applyLag = gauge("apply_lag_seconds", "Age of the oldest batch waiting for a worker, over all streams: how late "+
		"the index is for the most delayed pod (each pod's own in /v1/pods apply_lag_seconds).",
		func(s *Subscriber) float64 { return s.maxApplyLag().Seconds() })
	m.limits.activeStreams = gauge("active_streams", "Streams with batches waiting for their worker, which serves them in turn "+
		"(at most --queue-size per worker).", func(s *Subscriber) float64 { return float64(s.activeStreams()) })
	m.limits.applyStall = gauge("apply_stall_seconds", "How long the longest-running current apply (one batch or forget order) "+
		"has been running; past --apply-stall-timeout the daemon is not ready.", func(s *Subscriber) float64 { return s.ApplyStall().Seconds() })
	m.limits.sharedViews = gauge("shared_endpoint_views", "Endpoints reading through the connection of another endpoint at the same "+
		"address (one engine under several pod names, e.g. registered for two tenants), at most 255 more per address.",
		func(s *Subscriber) float64 { return float64(s.sharedViews.Load()) })
	if reg != nil {
		reg.MustRegister(m.MessagesReceived, m.BatchesDecoded, m.EventsDecoded, m.DecodeErrors, m.DroppedFrames,
			m.QueueOverflows, m.QueueWaits, m.QueueWaitSeconds, m.SeqGaps, m.MissedBatches, m.Restarts, m.Replays, m.CatchUps, m.CaughtUpBatches, m.Snapshots, m.IgnoredFields,
			m.UnknownMedia, m.PackedEvents, m.ReplayedBatches, m.Rebuilds, m.RebuiltBatches,
			m.SyntheticClears, m.ConnectedEndpoints, m.ShutdownDropped)
		reg.MustRegister(zmqCollectors(m.ZMQ)...)
		reg.MustRegister(m.limits.expired, m.limits.logSuppressed, m.limits.streams, m.limits.models, m.limits.queuedBytes, m.limits.applyLag,
			m.limits.rebuildsQueued, m.limits.activeStreams, m.limits.applyStall, m.limits.sharedViews)
	}
	return m
}

// zmqCollectors exports the transport's counters, read at scrape time.
func zmqCollectors(c *zmtp.Counters) []prometheus.Collector {
	const ns, sub = "kvindexd", "kvevents"
	counter := func(name, help string, v func(zmtp.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "zmq_" + name, Help: help},
			func() float64 { return float64(v(c.Read())) })
	}
	return []prometheus.Collector{
		counter("connections_accepted_total", "Connections the bind socket accepted.",
			func(s zmtp.Stats) uint64 { return s.Accepted }),
		counter("connections_rejected_total", "Connections closed at once because the bind socket held --zmq-max-conns "+
			"(or only the slots kept for hosts that published before were left) and no peer was idle long enough to evict.",
			func(s zmtp.Stats) uint64 { return s.Rejected }),
		counter("connections_evicted_total", "Idle connections (nothing delivered for --zmq-evict-idle-after) closed to make room on a full bind socket.",
			func(s zmtp.Stats) uint64 { return s.Evicted }),
		counter("message_timeouts_total", "Connections closed because a message did not arrive whole within --zmq-message-timeout of its first byte.",
			func(s zmtp.Stats) uint64 { return s.MessageTimeouts }),
		counter("messages_lost_total", "Connections that ended in the middle of a message; the streams arriving on them are listed incomplete (message_lost) until their next batch.",
			func(s zmtp.Stats) uint64 { return s.MessagesLost }),
		counter("handshakes_total", "ZMTP handshakes completed (bind, connect and replay sockets).",
			func(s zmtp.Stats) uint64 { return s.Handshakes }),
		counter("handshake_timeouts_total", "Connections closed because the handshake did not finish within --zmq-handshake-timeout.",
			func(s zmtp.Stats) uint64 { return s.HandshakeTimeouts }),
		counter("heartbeat_timeouts_total", "Connections closed because the peer stopped answering heartbeats.",
			func(s zmtp.Stats) uint64 { return s.HeartbeatTimeouts }),
		counter("oversized_total", "Connections closed because a frame or message exceeded --zmq-max-message-size (or the frame or command caps).",
			func(s zmtp.Stats) uint64 { return s.Oversized }),
		counter("buffer_budget_drops_total", "Connections closed because all connections together would buffer more than the budget.",
			func(s zmtp.Stats) uint64 { return s.BudgetExceeded }),
		counter("protocol_errors_total", "Connections closed for a malformed greeting, command or frame, or a wrong socket type.",
			func(s zmtp.Stats) uint64 { return s.ProtocolErrors }),
		counter("peer_errors_total", "Connections the peer ended with a ZMTP ERROR command.",
			func(s zmtp.Stats) uint64 { return s.PeerErrors }),
		counter("panics_total", "Connections closed by a recovered panic in the transport (a bug: please report).",
			func(s zmtp.Stats) uint64 { return s.Panics }),
		counter("filtered_messages_total", "Messages dropped by the transport because their topic matches no subscription.",
			func(s zmtp.Stats) uint64 { return s.Filtered }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "zmq_open_connections",
			Help: "ZMQ connections open now (bind, connect and replay sockets)."},
			func() float64 { return float64(c.Read().Open) }),
	}
}

// watch points the state gauges at s (the first Subscriber using m).
func (m *Metrics) watch(s *Subscriber) { m.sub.CompareAndSwap(nil, s) }
