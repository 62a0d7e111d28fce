package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"log/slog"
	"net"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/kvindex"
)

// Defaults. Config's zero values mean these, except Bind: "" disables the
// bind socket, so the daemon passes DefaultBind explicitly.
const (
	DefaultBind          = "tcp://*:5557"
	DefaultTopicFilter   = "kv@"
	DefaultQueueSize     = 1024
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 5 * time.Second
	DefaultReplayTimeout = 2 * time.Second
)

// EndpointConfig is one engine endpoint the subscriber connects to
// (per-pod topology: the engine's PUB binds, we connect).
type EndpointConfig struct {
	Address string // e.g. tcp://10.0.0.7:5557
	// Pod and Model, when set, override what the topic says.
	Pod, Model string
	Engine     kvindex.Engine
	// ReplayAddress is the engine's replay_endpoint (ROUTER); when set, a
	// sequence gap is repaired by asking it for the missed batches.
	ReplayAddress string
}

// Config configures a Subscriber.
type Config struct {
	// Bind is the endpoint of the SUB socket that engines connect to
	// (central topology). "" = no bind socket; the daemon's default is
	// DefaultBind ("tcp://*:5557").
	Bind       string
	BindEngine kvindex.Engine
	// TopicFilter is the subscription prefix; "" means DefaultTopicFilter
	// ("kv@"). Set AllTopics to subscribe to every topic (vLLM's default
	// topic is ""; such streams need an endpoint with an explicit Pod).
	TopicFilter string
	AllTopics   bool
	Endpoints   []EndpointConfig
	// Workers is the number of apply goroutines (default GOMAXPROCS). A
	// stream (pod, dp rank) always maps to the same worker.
	Workers int
	// QueueSize bounds each worker's queue, in batches (default 1024).
	QueueSize int
	// ReconnectMin/Max bound the exponential backoff between attempts to
	// (re)connect an endpoint (defaults 100ms and 5s).
	ReconnectMin, ReconnectMax time.Duration
	// ReplayTimeout bounds one replay exchange (default 2s).
	ReplayTimeout time.Duration
}

// EndpointStatus describes one socket for listings.
type EndpointStatus struct {
	Address       string
	Pod, Model    string
	Engine        kvindex.Engine
	ReplayAddress string
	Connected     bool // connect topology: a publisher is attached; bind: listening
	Bound         bool // this is the bind socket
}

// StreamStats describes one (pod, data-parallel rank) stream.
type StreamStats struct {
	Pod             string
	DPRank          int
	Model           string
	Endpoint        string // the endpoint (or bind address) it arrives on
	Engine          kvindex.Engine
	LastSeq         uint64
	Batches         uint64 // live batches accepted
	SeqGaps         uint64 // forward jumps
	MissedBatches   uint64 // batches skipped by those jumps
	ReplayedBatches uint64 // of which recovered by replay
	Restarts        uint64 // backward jumps (engine restarts)
	DecodeErrors    uint64 // malformed events dropped
	Overflows       uint64 // batches dropped on a full queue
}

// source is one socket's worth of configuration and state.
type source struct {
	addr      string
	pod       string
	model     string
	engine    kvindex.Engine
	replay    string
	bound     bool
	connected atomic.Bool
	cancel    context.CancelFunc
	done      chan struct{}
	msgs      prometheus.Counter
}

type streamKey struct {
	pod  string
	rank int
}

type stream struct {
	mu        sync.Mutex
	key       streamKey
	worker    int
	st        StreamStats
	hasSeq    bool
	needClear bool
	clearWhy  string
}

// Subscriber receives engine KV events over ZeroMQ, decodes them and hands
// them to a BatchSink, in order per (pod, dp rank).
//
// Ordering: every message is decoded and sequence-checked by the goroutine
// that reads its socket, then queued to the worker owning its stream, so a
// stream's batches apply in publication order while streams proceed in
// parallel on Workers goroutines.
//
// Completeness: whenever kvevents knows the sink's view of a stream is
// incomplete it delivers a synthetic AllBlocksCleared for that stream, in
// order, so the index never keeps blocks a pod may have dropped:
//   - the engine restarted (sequence number went backwards);
//   - a batch was dropped because the stream's worker queue was full: the
//     clear is prepended to the stream's next batch that gets queued;
//   - the endpoint was removed (RemoveEndpoint).
//
// A forward gap (lost messages) is counted and logged; when the endpoint
// has a ReplayAddress the missing batches are fetched and applied, in order,
// before the live one.
type Subscriber struct {
	cfg     Config
	filter  string
	filterB []byte
	sink    kvindex.BatchSink
	m       *Metrics
	log     *slog.Logger

	ctx       context.Context // lifetime of the bind socket; ended by Close
	cancel    context.CancelFunc
	closeOnce sync.Once

	bindSock zmq4.Socket
	bindSrc  *source
	bindAddr string // as listed (the real port, the configured host)
	bindDial string // BindAddr

	queues []chan *kvindex.Batch

	mu        sync.Mutex
	running   bool
	runCtx    context.Context
	wg        sync.WaitGroup
	endpoints map[string]*source
	order     []string
	streams   map[streamKey]*stream

	events  [2][4]prometheus.Counter // [engine][kind]
	batches [2]prometheus.Counter
	evErrs  [2]prometheus.Counter
	bErrs   [2]prometheus.Counter
}

var discardZMQLog = log.New(io.Discard, "", 0)

// NewSubscriber validates cfg and binds the bind socket (so a port in use is
// reported here). Nothing is received until Run; a caller that never runs it
// must Close it to release the socket.
func NewSubscriber(cfg Config, sink kvindex.BatchSink, m *Metrics, logger *slog.Logger) (*Subscriber, error) {
	if sink == nil {
		return nil, errors.New("kvevents: nil sink")
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	filter := cfg.TopicFilter
	if filter == "" {
		filter = DefaultTopicFilter
	}
	if cfg.AllTopics {
		filter = ""
	}
	s := &Subscriber{
		cfg:       cfg,
		filter:    filter,
		filterB:   []byte(filter),
		sink:      sink,
		m:         m,
		log:       logger.With("component", "kvevents"),
		endpoints: map[string]*source{},
		streams:   map[streamKey]*stream{},
	}
	for e := 0; e < 2; e++ {
		eng := kvindex.Engine(e).String()
		for k := kvindex.BlockStored; k <= kvindex.AllBlocksCleared; k++ {
			s.events[e][k] = m.EventsDecoded.WithLabelValues(eng, k.String())
		}
		s.batches[e] = m.BatchesDecoded.WithLabelValues(eng)
		s.evErrs[e] = m.DecodeErrors.WithLabelValues(eng, "event")
		s.bErrs[e] = m.DecodeErrors.WithLabelValues(eng, "batch")
	}
	s.queues = make([]chan *kvindex.Batch, cfg.Workers)
	for i := range s.queues {
		s.queues[i] = make(chan *kvindex.Batch, cfg.QueueSize)
	}
	for _, ep := range cfg.Endpoints {
		if err := s.AddEndpoint(ep); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Bind != "" {
		sock := zmq4.NewSub(s.ctx, zmq4.WithLogger(discardZMQLog))
		if err := sock.SetOption(zmq4.OptionSubscribe, filter); err != nil {
			s.cancel()
			return nil, fmt.Errorf("kvevents: subscribe: %w", err)
		}
		if err := sock.Listen(cfg.Bind); err != nil {
			sock.Close()
			s.cancel()
			return nil, fmt.Errorf("kvevents: bind %s: %w", cfg.Bind, err)
		}
		s.bindSock = sock
		s.bindAddr = cfg.Bind
		if a := sock.Addr(); a != nil && strings.HasPrefix(cfg.Bind, "tcp://") {
			s.bindAddr = "tcp://" + a.String()
		}
		s.bindDial = dialable(cfg.Bind, sock.Addr())
		s.bindSrc = &source{addr: s.bindAddr, engine: cfg.BindEngine, bound: true,
			msgs: m.MessagesReceived.WithLabelValues("bind")}
		s.bindSrc.connected.Store(true)
	}
	return s, nil
}

// BindAddr is the bind socket's address with the port actually bound and a
// wildcard host replaced by 127.0.0.1, i.e. an address a local engine can
// connect to ("" without a bind socket).
func (s *Subscriber) BindAddr() string { return s.bindDial }

// Close releases the bind socket. Run does that itself when it returns, so
// Close matters for a Subscriber whose Run never started (a daemon that
// failed to start after NewSubscriber); during Run it makes Run return.
// Calling it again, or after Run, does nothing.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.cancel() // first, so the bind reader sees why its socket failed
		if s.bindSock != nil {
			_ = s.bindSock.Close()
		}
	})
	return nil
}

// Run receives and dispatches until ctx is done or Close is called, then
// closes every socket.
func (s *Subscriber) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("kvevents: Run called twice")
	}
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return errors.New("kvevents: Run after Close")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	s.running = true
	s.runCtx = runCtx
	for i := range s.queues {
		q := s.queues[i]
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.work(runCtx, q)
		}()
	}
	if s.bindSock != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.log.Info("listening for engine KV events", "bind", s.bindAddr, "topic_filter", s.filter)
			s.recvLoop(runCtx, s.bindSock, s.bindSrc)
		}()
	}
	for _, addr := range s.order {
		s.startEndpoint(s.endpoints[addr])
	}
	s.mu.Unlock()

	<-runCtx.Done()
	s.Close()
	s.mu.Lock()
	for _, src := range s.endpoints {
		if src.cancel != nil { // nil: added after shutdown began, never started
			src.cancel()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Subscriber) work(ctx context.Context, q chan *kvindex.Batch) {
	for {
		select {
		case b := <-q:
			s.sink.Apply(ctx, b)
		case <-ctx.Done():
			return
		}
	}
}

// startEndpoint launches src's connect loop; s.mu must be held and Run active.
func (s *Subscriber) startEndpoint(src *source) {
	ctx, cancel := context.WithCancel(s.runCtx)
	src.cancel = cancel
	src.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(src.done)
		s.connectLoop(ctx, src)
	}()
}

// AddEndpoint adds a per-pod endpoint to connect to; it may be called before
// or during Run.
func (s *Subscriber) AddEndpoint(ep EndpointConfig) error {
	if !strings.Contains(ep.Address, "://") {
		return fmt.Errorf("kvevents: endpoint %q: want transport://address", ep.Address)
	}
	if ep.ReplayAddress != "" && !strings.Contains(ep.ReplayAddress, "://") {
		return fmt.Errorf("kvevents: replay endpoint %q: want transport://address", ep.ReplayAddress)
	}
	if ep.Engine != kvindex.EngineVLLM && ep.Engine != kvindex.EngineSGLang {
		return fmt.Errorf("kvevents: endpoint %q: unknown engine %d", ep.Address, ep.Engine)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.endpoints[ep.Address]; dup {
		return fmt.Errorf("kvevents: endpoint %q already added", ep.Address)
	}
	src := &source{addr: ep.Address, pod: ep.Pod, model: ep.Model, engine: ep.Engine, replay: ep.ReplayAddress,
		msgs: s.m.MessagesReceived.WithLabelValues("connect")}
	s.endpoints[ep.Address] = src
	s.order = append(s.order, ep.Address)
	if s.running && s.runCtx.Err() == nil {
		s.startEndpoint(src)
	}
	return nil
}

// ErrUnknownEndpoint is returned (wrapped) by RemoveEndpoint for an address
// that was never added, so callers can tell it from a shutdown.
var ErrUnknownEndpoint = errors.New("endpoint not found")

// RemoveEndpoint disconnects address and delivers AllBlocksCleared for every
// stream that arrived through it: nothing more will be heard about those
// pods, so what the index holds for them can no longer be kept current.
func (s *Subscriber) RemoveEndpoint(address string) error {
	s.mu.Lock()
	src, ok := s.endpoints[address]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("kvevents: %q: %w", address, ErrUnknownEndpoint)
	}
	delete(s.endpoints, address)
	for i, a := range s.order {
		if a == address {
			s.order = append(s.order[:i], s.order[i+1:]...)
			break
		}
	}
	running, runCtx := s.running, s.runCtx
	s.mu.Unlock()

	if src.cancel != nil {
		src.cancel()
		<-src.done // no batch of this endpoint is queued after the clears below
	}

	s.mu.Lock()
	var gone []*stream
	for k, st := range s.streams {
		if st.st.Endpoint == address {
			gone = append(gone, st)
			delete(s.streams, k)
		}
	}
	s.mu.Unlock()
	if !running {
		return nil
	}
	for _, st := range gone {
		st.mu.Lock()
		b := &kvindex.Batch{Pod: st.key.pod, DPRank: st.key.rank, Model: st.st.Model, Engine: st.st.Engine,
			Seq: st.st.LastSeq, Events: []kvindex.Event{{Kind: kvindex.AllBlocksCleared}}}
		st.mu.Unlock()
		select {
		case s.queues[st.worker] <- b:
			s.m.SyntheticClears.WithLabelValues("endpoint_removed").Inc()
		case <-runCtx.Done():
			return runCtx.Err()
		}
	}
	s.log.Info("endpoint removed", "endpoint", address, "streams_cleared", len(gone))
	return nil
}

// Endpoints lists the bind socket (if any) and every connect endpoint.
func (s *Subscriber) Endpoints() []EndpointStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []EndpointStatus
	if s.bindSrc != nil {
		out = append(out, EndpointStatus{Address: s.bindAddr, Engine: s.bindSrc.engine, Connected: true, Bound: true})
	}
	for _, a := range s.order {
		src := s.endpoints[a]
		out = append(out, EndpointStatus{Address: a, Pod: src.pod, Model: src.model, Engine: src.engine,
			ReplayAddress: src.replay, Connected: src.connected.Load()})
	}
	return out
}

// Streams lists every (pod, dp rank) stream seen, sorted by pod then rank.
func (s *Subscriber) Streams() []StreamStats {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	out := make([]StreamStats, 0, len(all))
	for _, st := range all {
		st.mu.Lock()
		out = append(out, st.st)
		st.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod != out[j].Pod {
			return out[i].Pod < out[j].Pod
		}
		return out[i].DPRank < out[j].DPRank
	})
	return out
}

// connectLoop keeps one endpoint connected, redialling with exponential
// backoff whenever the publisher goes away (a pod restarting, a network
// blip). zmq4's own reconnect is not used: it gives no signal, and we want
// Connected in Endpoints() and the backoff bounds.
func (s *Subscriber) connectLoop(ctx context.Context, src *source) {
	backoff := s.cfg.ReconnectMin
	for {
		sock := zmq4.NewSub(ctx, zmq4.WithLogger(discardZMQLog), zmq4.WithDialerMaxRetries(0),
			zmq4.WithDialerTimeout(max(s.cfg.ReconnectMax, time.Second)))
		err := sock.SetOption(zmq4.OptionSubscribe, s.filter)
		if err == nil {
			err = sock.Dial(src.addr)
		}
		if err == nil {
			src.connected.Store(true)
			s.m.ConnectedEndpoints.Inc()
			s.log.Info("connected to engine", "endpoint", src.addr)
			backoff = s.cfg.ReconnectMin
			s.recvLoop(ctx, sock, src)
			src.connected.Store(false)
			s.m.ConnectedEndpoints.Dec()
			if ctx.Err() == nil {
				s.log.Warn("engine publisher went away; reconnecting", "endpoint", src.addr)
			}
		} else {
			s.log.Debug("connect failed", "endpoint", src.addr, "err", err, "retry_in", backoff)
		}
		sock.Close()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.ReconnectMax)
	}
}

// recvLoop reads messages until the socket fails. For the bind socket an
// error is one engine's connection closing: keep going.
func (s *Subscriber) recvLoop(ctx context.Context, sock zmq4.Socket, src *source) {
	for {
		msg, err := sock.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// s.ctx ends before Close closes the bind socket, so a closed
			// socket is never mistaken for one engine going away.
			if src.bound && s.ctx.Err() == nil {
				continue
			}
			return
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		s.handle(ctx, src, msg.Frames)
	}
}

func (s *Subscriber) drop(reason string) {
	s.m.DroppedFrames.WithLabelValues(reason).Inc()
}

// parseTopic splits kv@<pod>@<model>: pod is between the first and second
// '@', model is everything after the second (model names may contain '@').
func parseTopic(topic []byte) (pod, model []byte) {
	i := bytes.IndexByte(topic, '@')
	if i < 0 {
		return nil, nil
	}
	rest := topic[i+1:]
	j := bytes.IndexByte(rest, '@')
	if j < 0 {
		return rest, nil
	}
	return rest[:j], rest[j+1:]
}

func (s *Subscriber) handle(ctx context.Context, src *source, frames [][]byte) {
	src.msgs.Inc()
	if len(frames) != 3 {
		s.drop("frame_count")
		return
	}
	if len(frames[1]) != 8 {
		s.drop("seq_length")
		return
	}
	topic := frames[0]
	if !bytes.HasPrefix(topic, s.filterB) {
		s.drop("topic_filter")
		return
	}
	podB, modelB := parseTopic(topic)
	pod, model := src.pod, src.model
	if pod == "" {
		pod = string(podB)
	}
	if model == "" {
		model = string(modelB)
	}
	if pod == "" {
		s.drop("no_pod")
		return
	}
	b := &kvindex.Batch{Pod: pod, Model: model, Engine: src.engine, Seq: binary.BigEndian.Uint64(frames[1])}
	ok, evErrs := s.decode(frames[2], b, src)
	if !ok {
		return
	}
	st := s.stream(streamKey{pod, b.DPRank})
	st.mu.Lock()
	defer st.mu.Unlock()
	// The endpoint a stream's latest batch came through is the one whose
	// removal clears it (RemoveEndpoint).
	st.st.Endpoint, st.st.Engine = src.addr, src.engine
	st.st.Model = model
	st.st.DecodeErrors += uint64(evErrs)
	s.sequence(ctx, st, src, b)
}

// decode decodes payload into b and counts the outcome; it reports whether
// b is usable and how many of its events were dropped.
func (s *Subscriber) decode(payload []byte, b *kvindex.Batch, src *source) (bool, int) {
	e := b.Engine & 1
	ds, err := Decode(payload, b.Engine, b)
	if err != nil {
		s.bErrs[e].Inc()
		s.log.Warn("dropping malformed KV event message", "pod", b.Pod, "seq", b.Seq, "endpoint", src.addr, "err", err)
		return false, 0
	}
	s.batches[e].Inc()
	for i := range b.Events {
		if k := b.Events[i].Kind; k <= kvindex.AllBlocksCleared {
			s.events[e][k].Inc()
		}
	}
	if ds.EventErrors > 0 {
		s.evErrs[e].Add(float64(ds.EventErrors))
		s.log.Warn("dropped malformed KV events", "pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq,
			"dropped", ds.EventErrors, "first", ds.FirstEventError)
	}
	return true, ds.EventErrors
}

// stream returns k's stream, creating it on first sight. Its worker is fixed
// for life: that is what keeps a stream's batches in order.
func (s *Subscriber) stream(k streamKey) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[k]
	if st == nil {
		h := fnv.New32a()
		h.Write([]byte(k.pod))
		w := int((h.Sum32() ^ uint32(k.rank)*0x9e3779b1) % uint32(len(s.queues)))
		st = &stream{key: k, worker: w}
		st.st.Pod, st.st.DPRank = k.pod, k.rank
		s.streams[k] = st
	}
	return st
}

// sequence checks b's seq against the stream, repairs or flags what it finds
// and queues b. st.mu is held.
func (s *Subscriber) sequence(ctx context.Context, st *stream, src *source, b *kvindex.Batch) {
	if st.hasSeq {
		last := st.st.LastSeq
		switch {
		case b.Seq == last+1:
		case b.Seq > last+1:
			missed := b.Seq - last - 1
			st.st.SeqGaps++
			st.st.MissedBatches += missed
			s.m.SeqGaps.Inc()
			s.m.MissedBatches.Add(float64(missed))
			s.log.Warn("KV event sequence gap: batches lost", "pod", b.Pod, "dp_rank", b.DPRank,
				"last_seq", last, "seq", b.Seq, "missed", missed, "replay", src.replay != "")
			if src.replay != "" {
				s.replay(ctx, st, src, last+1, b.Seq)
			}
		default:
			st.st.Restarts++
			s.m.Restarts.Inc()
			s.log.Warn("engine restart detected (sequence went backwards): clearing pod", "pod", b.Pod,
				"dp_rank", b.DPRank, "last_seq", last, "seq", b.Seq)
			st.needClear, st.clearWhy = true, "restart"
		}
	}
	st.hasSeq = true
	st.st.LastSeq = b.Seq
	st.st.Batches++
	s.enqueue(st, b)
}

// enqueue hands b to its worker without blocking the socket reader. On a
// full queue the batch is dropped and the stream marked: a synthetic
// AllBlocksCleared goes in front of its next queued batch, because the sink
// has now missed events and its state for the pod is no longer complete.
func (s *Subscriber) enqueue(st *stream, b *kvindex.Batch) {
	if st.needClear {
		ev := make([]kvindex.Event, 0, len(b.Events)+1)
		ev = append(ev, kvindex.Event{Kind: kvindex.AllBlocksCleared})
		b.Events = append(ev, b.Events...)
	}
	select {
	case s.queues[st.worker] <- b:
		if st.needClear {
			s.m.SyntheticClears.WithLabelValues(st.clearWhy).Inc()
			st.needClear = false
		}
	default:
		st.st.Overflows++
		s.m.QueueOverflows.Inc()
		if !st.needClear || st.clearWhy != "overflow" {
			s.log.Warn("worker queue full: dropping batch; pod will be cleared before its next batch",
				"pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq)
		}
		st.needClear, st.clearWhy = true, "overflow"
	}
}

var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replay asks the engine's replay socket (ROUTER) for batches [from, to) and
// queues them in order. Replies are ["", seq8, payload] (vLLM <= 0.25) or
// ["", topic, seq8, payload] (>= 0.26), then an end marker with seq
// 0xffffffffffffffff and an empty payload. st.mu is held.
func (s *Subscriber) replay(ctx context.Context, st *stream, src *source, from, to uint64) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithLogger(discardZMQLog), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	defer d.Close()
	result := func(r string, got uint64, err error) {
		s.m.Replays.WithLabelValues(r).Inc()
		s.m.ReplayedBatches.Add(float64(got))
		st.st.ReplayedBatches += got
		lvl := slog.LevelInfo
		if r != "ok" {
			lvl = slog.LevelWarn
		}
		s.log.Log(ctx, lvl, "replay finished", "pod", st.key.pod, "dp_rank", st.key.rank, "from", from,
			"to", to, "recovered", got, "wanted", to-from, "result", r, "err", err)
	}
	if err := d.Dial(src.replay); err != nil {
		result("error", 0, err)
		return
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		result("error", 0, err)
		return
	}
	var got uint64
	next := from
	for {
		msg, err := d.Recv()
		if err != nil {
			r := "error"
			if got > 0 {
				r = "partial"
			}
			result(r, got, err)
			return
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		var seqB, payload []byte
		switch len(f) {
		case 2:
			seqB, payload = f[0], f[1]
		case 3:
			seqB, payload = f[1], f[2]
		default:
			s.drop("replay_frame_count")
			continue
		}
		if len(seqB) != 8 {
			s.drop("replay_seq_length")
			continue
		}
		if bytes.Equal(seqB, endSeq[:]) {
			r := "ok"
			var err error
			if got < to-from {
				r, err = "partial", errors.New("engine no longer buffers every missed batch")
			}
			result(r, got, err)
			return
		}
		seq := binary.BigEndian.Uint64(seqB)
		if seq < next || seq >= to {
			continue // outside the gap, or a duplicate
		}
		b := &kvindex.Batch{Pod: st.key.pod, Model: st.st.Model, Engine: src.engine, Seq: seq}
		ok, evErrs := s.decode(payload, b, src)
		if !ok {
			continue
		}
		st.st.DecodeErrors += uint64(evErrs)
		if b.DPRank != st.key.rank {
			continue
		}
		next = seq + 1
		got++
		s.enqueue(st, b)
	}
}

// dialable turns a bound tcp endpoint into one a local peer can connect to:
// the listener's real address (port 0 resolved) with a wildcard host
// (tcp://*:N, 0.0.0.0, ::) replaced by 127.0.0.1. Other transports are
// returned as they are.
func dialable(endpoint string, a net.Addr) string {
	if !strings.HasPrefix(endpoint, "tcp://") || a == nil {
		return endpoint
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return endpoint
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, port)
}
