package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// Defaults. Config's zero values mean these (the tunables' rows in Options
// read them; withDefaults applies them), except Bind: "" disables the bind
// socket, so DefaultConfig sets DefaultBind explicitly.
const (
	DefaultBind          = "tcp://*:5557"
	DefaultTopicFilter   = "kv@"
	DefaultQueueSize     = 1024
	DefaultReconnectMin  = 100 * time.Millisecond
	DefaultReconnectMax  = 5 * time.Second
	DefaultReplayTimeout = 2 * time.Second
	// DefaultRebuildTimeout bounds a rebuild from the whole replay buffer
	// (rebuild.go): vLLM's default 10,000 batches of 16 blocks took ~3.3 s
	// into a local Redis, so 2 s would leave such a pod incomplete.
	DefaultRebuildTimeout = 30 * time.Second
	DefaultDrainTimeout   = 2 * time.Second
)

// Config configures a Subscriber. A zero tunable means its default (see
// Options, DefaultConfig and ValidateConfig in options.go).
type Config struct {
	// Bind is the endpoint of the SUB socket that engines connect to
	// (central topology). "" = no bind socket; the daemon's default is
	// DefaultBind ("tcp://*:5557").
	Bind       string
	BindEngine blockkeys.Engine
	// BindFirstSeq is the sequence number the bind socket's publishers
	// start at (Options.BindFirstSeq): 0 for the engines, 1 for llm-d's
	// publishers. Only a first batch carrying it starts a stream complete.
	BindFirstSeq uint64
	// TopicFilter is the subscription prefix; "" means DefaultTopicFilter
	// ("kv@"). Set AllTopics to subscribe to every topic (vLLM's default
	// topic is ""; such streams need an endpoint with an explicit Pod).
	TopicFilter string
	AllTopics   bool
	Endpoints   []EndpointConfig
	// Workers is the number of apply goroutines (Options.Workers; 0 =
	// GOMAXPROCS). A stream (pod, dp rank) always maps to the same worker.
	Workers int
	// QueueSize bounds each worker's queue, in batches (Options.QueueSize).
	QueueSize int
	// QueueWait is how long a socket reader waits for room in a full queue
	// before dropping the batch and clearing its pod (default
	// DefaultQueueWait; negative: drop at once). See dispatcher_backpressure.go.
	QueueWait time.Duration
	// ReconnectMin/Max bound the exponential backoff between attempts to
	// (re)connect an endpoint (defaults 100ms and 5s).
	ReconnectMin, ReconnectMax time.Duration
	// ReplayTimeout bounds one replay exchange, connecting included
	// (Options.ReplayTimeout).
	ReplayTimeout time.Duration
	// RebuildTimeout bounds one rebuild of a stream the index lost from
	// the engine's whole replay buffer, its exchange and queuing included
	// (Options.RebuildTimeout). The stream's live batches wait for it.
	RebuildTimeout time.Duration
	// RebuildAttemptTimeout bounds one rebuild's replay exchange, the
	// waits for room in the pod's queue share excluded, and RebuildMaxBytes
	// the topics and payloads it may send (Options; rebuild_budget.go):
	// one replay endpoint's share of the rebuild workers.
	RebuildAttemptTimeout time.Duration
	RebuildMaxBytes       int64
	// DisableCatchUp stops the subscriber from asking an endpoint's replay
	// address for its buffer each time it (re)connects; gaps are still
	// replayed. Catching up is what lets a daemon that starts after an
	// engine serve that engine before its next event.
	DisableCatchUp bool
	// MaxSnapshotRecords bounds the records of one engine snapshot
	// (default DefaultMaxSnapshotRecords); a larger one is refused.
	MaxSnapshotRecords int
	// DrainTimeout bounds how long Run keeps applying the batches still
	// queued when it stops (default 2s; negative: none are applied). The
	// context given to BatchSink.Apply ends when it expires; what is still
	// queued then is dropped and counted (shutdown_dropped_batches_total).
	DrainTimeout time.Duration
	// MaxStreams, MaxModels and MaxDPRanks bound the (pod, dp rank) streams,
	// the model names and the ranks accepted (their rows in Options); a
	// batch beyond them is dropped and counted. PodExpiry (Options.PodExpiry;
	// negative: never) forgets a stream silent that long, clearing it from
	// the sink. QueueBytes (default 256 MiB) bounds the decoded batches
	// queued for all workers; beyond it a batch overflows like on a full
	// queue. See limits.go.
	MaxStreams, MaxModels, MaxDPRanks int
	PodExpiry                         time.Duration
	QueueBytes                        int64
	// Refuse, when set, is asked about every decoded batch before its
	// stream is admitted; a batch it refuses is dropped there (Refuse
	// counts and logs it) and takes no stream under MaxStreams, no model
	// under MaxModels and no queue room, nor earns a bind connection its
	// slot. The indexer refuses the storage claims no configured source
	// names with it: before, each refused claim's stream still counted
	// against MaxStreams. It is called on the socket readers' goroutines,
	// concurrently.
	Refuse func(b *event.Batch) bool
	// Transport bounds what a ZMQ peer can make every socket (bind,
	// connect, replay) do: message size, handshake deadline, connections,
	// buffered bytes. A zero field means its row in Options where it has one
	// (the daemon's --zmq-* flags), else zmtp's default. Its Counters
	// field is ignored: the sockets count into Metrics.ZMQ.
	Transport zmtp.Options
}

// Subscriber receives engine KV events over ZeroMQ, decodes them and hands
// them to a BatchSink, in order per (pod, dp rank).
//
// The package documentation lists which file holds which role.
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
//   - the endpoint was removed (RemoveEndpoint);
//   - a pod restored from a saved index whose engine restarted since, or
//     whose saved state names no sequence number (ResumeFrom);
//   - a pod whose index write failed and that stays quiet: the sink clears
//     it before its next batch, and this clear, queued every second while
//     the pod is held, recovers it without one (trust.go).
//
// A forward gap (lost messages) is counted and logged; when the endpoint
// has a ReplayAddress the missing batches are fetched and applied, in order,
// before the live one, and the endpoint's buffer is asked for at every
// (re)connect (catching up; see DisableCatchUp). The exchange holds up only
// the reader of the socket concerned: Streams and Endpoints never wait on the
// network. StreamStats.Complete says whether the sink has every batch since
// the engine's cache was last empty.
//
// Trust: the Subscriber is the one owner of whether a pod's entries may be
// served (Servable) and whether they are complete (StreamStats); the sink
// reports each batch's outcome (event.ApplyOutcome) and the worker records
// it right after Apply. See the package documentation and trust.go.
//
// Shutdown: the sockets close first, then the workers apply what is still
// queued for at most DrainTimeout; the rest is dropped and counted.
type Subscriber struct {
	cfg         Config
	filter      string
	filterBytes []byte
	metrics     *Metrics
	log         *slog.Logger
	counts      decodeCounters
	dispatcher  *dispatcher
	logs        *logLimiter
	// lostStreams counts the streams whose reason is "index_lost"
	// (Rebuilding).
	lostStreams atomic.Int64

	ctx       context.Context // lifetime of the bind socket; ended by Close
	cancel    context.CancelFunc
	closeOnce sync.Once

	bindSock *zmtp.Sub
	bindSrc  *source
	bindAddr string // as listed (the real port, the configured host)
	bindDial string // BindAddr

	mu        sync.Mutex
	running   bool
	runCtx    context.Context
	readers   sync.WaitGroup // one goroutine per socket
	endpoints map[string]*source
	order     []string
	// sharedViews counts the endpoints reading through another's
	// connection (EndpointConfig.Share): views beyond each hub's first.
	sharedViews atomic.Int64
	streams     map[streamKey]*stream
	limits      limits
	rebuilds    rebuilds
	// trust is the one owner of whether a pod's entries may be served
	// (trust.go); completeness lives in each stream's StreamStats.
	trust trustTable
}

// NewSubscriber validates cfg and binds the bind socket (so a port in use is
// reported here). Nothing is received until Run; a caller that never runs it
// must Close it to release the socket.
func NewSubscriber(cfg Config, sink event.Sink, m *Metrics, logger *slog.Logger) (*Subscriber, error) {
	if sink == nil {
		return nil, errors.New("kvevents: nil sink")
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := ValidateConfig(cfg); err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	cfg = cfg.withDefaults()
	cfg.Transport.Counters = m.ZMQ
	var s *Subscriber // for the transport's disconnect hook, set below
	userHook := cfg.Transport.OnDisconnect
	cfg.Transport.OnDisconnect = func(peer string, err error) {
		s.disconnected(peer, err)
		if userHook != nil {
			userHook(peer, err)
		}
	}
	filter := cfg.TopicFilter
	if filter == "" {
		filter = DefaultTopicFilter
	}
	if cfg.AllTopics {
		filter = ""
	}
	log := logger.With("component", "kvevents")
	s = &Subscriber{
		cfg:         cfg,
		filter:      filter,
		filterBytes: []byte(filter),
		metrics:     m,
		log:         log,
		counts:      newDecodeCounters(m),
		dispatcher:  newDispatcher(sink, cfg.Workers, cfg.QueueSize, cfg.QueueBytes, m, log),
		logs:        newLogLimiter(m.limits.logSuppressed),
		endpoints:   map[string]*source{},
		streams:     map[streamKey]*stream{},
		limits:      newLimits(),
		rebuilds:    rebuilds{spacing: defaultRebuildSpacing, mergeBytes: rebuildMergeBytes},
	}
	s.dispatcher.rec = s
	m.watch(s)
	s.dispatcher.backpressure = backpressure{wait: cfg.QueueWait, waits: m.QueueWaits, waitSecs: m.QueueWaitSeconds}
	for _, ep := range cfg.Endpoints {
		if err := s.AddEndpoint(ep); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.Bind != "" {
		if !cfg.BindEngine.Valid() {
			s.cancel()
			return nil, fmt.Errorf("kvevents: bind engine %d: want one of %s", cfg.BindEngine, blockkeys.EngineNames())
		}
		bindOpts := cfg.Transport
		bindOpts.UsefulMarks = true
		sock, err := zmtp.ListenSub(cfg.Bind, bindOpts, filter)
		if err != nil {
			s.cancel()
			return nil, fmt.Errorf("kvevents: bind %s: %w", cfg.Bind, err)
		}
		s.bindSock = sock
		s.bindAddr = cfg.Bind
		if a := sock.Addr(); a != nil && strings.HasPrefix(cfg.Bind, "tcp://") {
			s.bindAddr = "tcp://" + a.String()
		}
		s.bindDial = dialable(cfg.Bind, sock.Addr())
		s.bindSrc = &source{addr: s.bindAddr, engine: cfg.BindEngine, bound: true, firstSeq: cfg.BindFirstSeq,
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
// closes every socket and drains the worker queues (see DrainTimeout).
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
	s.dispatcher.start(runCtx)
	if s.bindSock != nil {
		s.readers.Add(1)
		go func() {
			defer s.readers.Done()
			s.log.Info("listening for engine KV events", "bind", s.bindAddr, "topic_filter", s.filter)
			_ = s.recvLoop(runCtx, s.bindSock, s.bindSrc) // ends only when the socket is closed
		}()
	}
	for _, addr := range s.order {
		s.startEndpoint(s.endpoints[addr])
	}
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		s.recoverLoop(runCtx, recoveryInterval)
	}()
	if s.cfg.PodExpiry > 0 {
		s.readers.Add(1)
		go func() {
			defer s.readers.Done()
			s.expireLoop(runCtx)
		}()
	}
	s.mu.Unlock()

	<-runCtx.Done()
	// Readers first, so nothing is queued once the workers start draining.
	s.Close()
	s.mu.Lock()
	for _, src := range s.endpoints {
		if src.cancel != nil { // nil: added after shutdown began, never started
			src.cancel()
		}
	}
	s.mu.Unlock()
	s.readers.Wait()
	s.dispatcher.stop(s.cfg.DrainTimeout)
	return nil
}
