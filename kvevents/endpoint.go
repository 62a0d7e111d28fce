package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// EndpointConfig is one engine endpoint the subscriber connects to
// (per-pod topology: the engine's PUB binds, we connect).
type EndpointConfig struct {
	Address string // e.g. tcp://10.0.0.7:5557
	// Pod and Model, when set, override what the topic says.
	Pod, Model string
	Engine     blockkeys.Engine
	// ReplayAddress is the engine's replay_endpoint (ROUTER, tcp:// or
	// ipc://); when set, a sequence gap is repaired by asking it for the
	// missed batches.
	ReplayAddress string
	// SnapshotAddress is SGLang's snapshot_endpoint (ROUTER, tcp:// or
	// ipc://); when set, a stream that lost batches beyond what replay
	// repairs has its state replaced by a snapshot (see snapshot.go).
	SnapshotAddress string
	// Role is the pod's P/D role as discovery read it (llm-d.ai/role) or
	// the endpoint's configuration says, for listings only ("" = none).
	Role string
	// DPRank is the data-parallel rank of batches that carry none (one
	// socket per rank, as NVIDIA Dynamo's /register declares it); a
	// batch's own data_parallel_rank wins. Below --max-dp-ranks.
	DPRank int
	// AllTopics subscribes to every topic of this endpoint whatever the
	// daemon's --topic-filter: Pod names the stream, so the topic need not
	// (vLLM's default topic is "", which NVIDIA Dynamo's listener reads).
	AllTopics bool
	// Share lets this endpoint read through the connection of other Share
	// endpoints at the same Address instead of being refused as a
	// duplicate: one engine indexed under several (Pod, Model) names, e.g.
	// registered for two tenants through NVIDIA Dynamo's /register. Every
	// sharer gets each message decoded as its own stream; the engine sees
	// one subscriber. Needs Pod, distinct among the sharers, and the same
	// Engine, ReplayAddress, SnapshotAddress and AllTopics. At most
	// MaxEndpointShares endpoints share an address.
	Share bool
}

// EndpointStatus describes one socket for listings.
type EndpointStatus struct {
	Address         string
	Pod, Model      string
	Role            string
	Engine          blockkeys.Engine
	ReplayAddress   string
	SnapshotAddress string
	DPRank          int  // EndpointConfig.DPRank
	Connected       bool // connect topology: a publisher is attached; bind: listening
	Bound           bool // this is the bind socket
}

// source is one socket's worth of configuration and state.
type source struct {
	addr     string
	pod      string
	model    string
	engine   blockkeys.Engine
	firstSeq uint64 // the seq its publishers start at (Config.BindFirstSeq; 0 for endpoints)
	replay   string
	snapshot string
	role     string
	dpRank   int // default rank of batches that carry none
	// noFilter: the endpoint takes every topic (EndpointConfig.AllTopics).
	noFilter  bool
	bound     bool
	connected atomic.Bool
	// ctx is the endpoint's lifetime once started (nil before): its reader
	// and its streams' rebuilds end with it.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// rebuilds counts its streams' rebuilds in progress (rebuild.go), which
	// RemoveEndpoint waits for like for its reader.
	rebuilds sync.WaitGroup
	msgs     prometheus.Counter
	// peer is the connection of the message being handled; only the
	// socket's reader touches it.
	peer string

	// Sharing (EndpointConfig.Share, endpoint_share.go). A shared address is
	// held by a hub: it owns the connection, has no streams of its own and
	// hands each message to its views, the sources added for the address;
	// a view's conn is its hub.
	share bool
	hub   bool
	conn  *source
	views atomic.Pointer[[]*source] // the hub's; replaced, never modified
	// handling is held while a message (or a catch-up batch) is handed to
	// the source; removing a view takes it to wait out the one in hand.
	handling sync.Mutex
	removed  bool // under handling
}

// ErrUnknownEndpoint is returned (wrapped) by RemoveEndpoint for an address
// that was never added, so callers can tell it from a shutdown.
var ErrUnknownEndpoint = errors.New("endpoint not found")

// AddEndpoint adds a per-pod endpoint to connect to; it may be called before
// or during Run.
func (s *Subscriber) AddEndpoint(ep EndpointConfig) error {
	if !strings.Contains(ep.Address, "://") {
		return fmt.Errorf("kvevents: endpoint %q: want transport://address", ep.Address)
	}
	for _, a := range []string{ep.ReplayAddress, ep.SnapshotAddress} {
		if a == "" {
			continue
		}
		if err := checkReplayAddr(a); err != nil {
			return fmt.Errorf("kvevents: %w", err)
		}
	}
	if why := checkName([]byte(ep.Pod), MaxPodNameBytes); why != "" {
		return fmt.Errorf("kvevents: endpoint %q: pod name: %s", ep.Address, why)
	}
	if why := checkName([]byte(ep.Model), MaxModelNameBytes); why != "" {
		return fmt.Errorf("kvevents: endpoint %q: model name: %s", ep.Address, why)
	}
	if !ep.Engine.Valid() {
		return fmt.Errorf("kvevents: endpoint %q: unknown engine %d", ep.Address, ep.Engine)
	}
	if ep.DPRank < 0 || (ep.DPRank > 0 && ep.DPRank >= s.cfg.MaxDPRanks) {
		return fmt.Errorf("kvevents: endpoint %q: dp_rank %d outside 0..%d (--max-dp-ranks)", ep.Address, ep.DPRank, s.cfg.MaxDPRanks-1)
	}
	if ep.Share && ep.Pod == "" {
		return fmt.Errorf("kvevents: endpoint %q: a shared endpoint needs a pod name (its messages are told apart by it)", ep.Address)
	}
	src := &source{addr: ep.Address, pod: ep.Pod, model: ep.Model, engine: ep.Engine, replay: ep.ReplayAddress,
		snapshot: ep.SnapshotAddress, role: ep.Role, dpRank: ep.DPRank, noFilter: ep.AllTopics && ep.Pod != "",
		share: ep.Share, msgs: s.metrics.MessagesReceived.WithLabelValues("connect")}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, dup := s.endpoints[ep.Address]; dup || ep.Share {
		if !dup || (prev.hub && ep.Share) {
			return s.addViewLocked(prev, src)
		}
		return fmt.Errorf("kvevents: endpoint %q already added", ep.Address)
	}
	s.endpoints[ep.Address] = src
	s.order = append(s.order, ep.Address)
	if s.running && s.runCtx.Err() == nil {
		s.startEndpoint(src)
	}
	return nil
}

// startEndpoint launches src's connect loop; s.mu must be held and Run active.
func (s *Subscriber) startEndpoint(src *source) {
	ctx, cancel := context.WithCancel(s.runCtx)
	src.ctx, src.cancel = ctx, cancel
	if src.hub {
		for _, v := range *src.views.Load() {
			v.ctx, v.cancel = context.WithCancel(ctx)
		}
	}
	src.done = make(chan struct{})
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		defer close(src.done)
		s.connectLoop(ctx, src)
	}()
}

// RemoveEndpoint disconnects address and delivers AllBlocksCleared for every
// stream that arrived through it: nothing more will be heard about those
// pods, so what the index holds for them can no longer be kept current.
// Every endpoint sharing the address (EndpointConfig.Share) goes with it;
// RemoveEndpointPod removes one.
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
	var views []*source
	if src.hub {
		views = *src.views.Load()
		s.sharedViews.Add(-int64(len(views) - 1))
	}
	s.mu.Unlock()

	if src.cancel != nil {
		src.cancel() // also ends a replay exchange or rebuild in progress
		<-src.done   // no batch of this endpoint is queued after the clears below
		src.rebuilds.Wait()
		for _, v := range views {
			v.rebuilds.Wait()
		}
	}
	return s.clearEndpointStreams(address, "")
}

// clearEndpointStreams forgets the streams whose latest batch came through
// address (of pod only, unless pod is "") and queues an AllBlocksCleared for
// each. Nothing of theirs is in hand or can still be queued.
func (s *Subscriber) clearEndpointStreams(address, pod string) error {
	s.mu.Lock()
	var gone []*stream
	for k, st := range s.streams {
		if st.currentStats().Endpoint == address && (pod == "" || k.pod == pod) {
			gone = append(gone, st)
			s.forgetStreamLocked(k)
		}
	}
	running, runCtx := s.running, s.runCtx
	s.mu.Unlock()
	if !running {
		return nil
	}
	for _, st := range gone {
		ss := st.currentStats()
		b := &event.Batch{Pod: st.key.pod, DPRank: st.key.rank, Model: ss.Model, Engine: ss.Engine,
			Seq: ss.LastSeq, Events: []event.Event{{Kind: event.AllBlocksCleared}}}
		if err := s.dispatcher.queue(runCtx, st.worker, b); err != nil {
			return err
		}
		s.metrics.SyntheticClears.WithLabelValues("endpoint_removed").Inc()
	}
	s.log.Info("endpoint removed", "endpoint", address, "pod", pod, "streams_cleared", len(gone))
	return nil
}

// topicFilter is the subscription prefix of src's socket.
func (s *Subscriber) topicFilter(src *source) string {
	if src.noFilter {
		return ""
	}
	return s.filter
}

// topicAllowed reports whether src takes a message of topic.
func (s *Subscriber) topicAllowed(src *source, topic []byte) bool {
	return src.noFilter || bytes.HasPrefix(topic, s.filterBytes)
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
		if src.hub {
			for _, v := range *src.views.Load() {
				out = append(out, EndpointStatus{Address: a, Pod: v.pod, Model: v.model, Role: v.role, Engine: v.engine,
					ReplayAddress: v.replay, SnapshotAddress: v.snapshot, DPRank: v.dpRank, Connected: src.connected.Load()})
			}
			continue
		}
		out = append(out, EndpointStatus{Address: a, Pod: src.pod, Model: src.model, Role: src.role, Engine: src.engine,
			ReplayAddress: src.replay, SnapshotAddress: src.snapshot, DPRank: src.dpRank, Connected: src.connected.Load()})
	}
	return out
}

// healthyConnection is how long a connection to an endpoint must last for
// the reconnect backoff to start again from ReconnectMin. A hostile or
// broken "engine" that completes the handshake and then closes (or sends
// what the transport refuses) is otherwise redialled every ReconnectMin.
const healthyConnection = 10 * time.Second

// connectLoop keeps one endpoint connected, redialling with exponential
// backoff whenever the publisher goes away (a pod restarting, a network
// blip). The transport does not reconnect by itself: we want Connected in
// Endpoints() and the backoff bounds. The backoff grows on failed dials and
// on connections that end within healthyConnection; the reason each ends is
// logged through the rate limiter (limits.go).
func (s *Subscriber) connectLoop(ctx context.Context, src *source) {
	backoff := s.cfg.ReconnectMin
	for {
		// The dial and the handshake are bounded; the connection is not.
		dctx, cancel := context.WithTimeout(ctx, max(s.cfg.ReconnectMax, time.Second))
		sock, err := zmtp.DialSub(dctx, src.addr, s.cfg.Transport, s.topicFilter(src))
		cancel()
		if err == nil {
			start := time.Now()
			src.connected.Store(true)
			s.metrics.ConnectedEndpoints.Inc()
			if backoff == s.cfg.ReconnectMin {
				s.log.Info("connected to engine", "endpoint", src.addr)
			} else {
				s.log.Debug("connected to engine", "endpoint", src.addr)
			}
			if src.replay != "" && !s.cfg.DisableCatchUp {
				s.catchUp(ctx, src)
			}
			why := s.recvLoop(ctx, sock, src)
			sock.Close()
			src.connected.Store(false)
			s.metrics.ConnectedEndpoints.Dec()
			lived := time.Since(start)
			if lived >= healthyConnection {
				backoff = s.cfg.ReconnectMin
			}
			if ctx.Err() == nil {
				s.warn(src.addr+"|gone", "engine publisher went away; reconnecting", "endpoint", src.addr, "err", why,
					"connected_for", lived.Round(time.Millisecond), "retry_in", backoff)
			}
		} else {
			s.log.Debug("connect failed", "endpoint", src.addr, "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.ReconnectMax)
	}
}

// recvLoop reads messages until the socket fails, and says why: for a
// dialled socket, its one connection ended (the caller redials); a bound
// socket fails only once closed, its connections failing one by one inside
// the transport.
func (s *Subscriber) recvLoop(ctx context.Context, sock *zmtp.Sub, src *source) error {
	for {
		msg, err := sock.Recv(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if src.hub {
			src.msgs.Inc() // once, not per view
			for _, v := range *src.views.Load() {
				s.handleView(v, msg.Peer, msg.Frames)
			}
			continue
		}
		src.peer = msg.Peer
		if s.handle(ctx, src, msg.Frames) && src.bound {
			// Only a batch with events earns its connection a place
			// (zmtp.Options.UsefulMarks): a peer sending empty batches is
			// as evictable as a silent one.
			sock.MarkUseful(msg)
		}
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
