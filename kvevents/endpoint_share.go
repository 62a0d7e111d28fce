package kvevents

import (
	"context"
	"fmt"
	"slices"
)

// One engine may be indexed under several (pod, model) names: NVIDIA
// Dynamo's /register lets two tenants register the same engine address
// (each under its own instance id), and Dynamo then reads it twice. Here
// the endpoints added with EndpointConfig.Share read through one
// connection: the engine sees one subscriber, and each message is decoded
// once per sharer into that sharer's own stream, so each keeps its own
// sequence, replay, trust and removal. A gap is replayed per stream (each
// asks the engine's replay socket); catch-up after a (re)connect is one
// exchange handed to every sharer.

// MaxEndpointShares bounds the endpoints sharing one address: each costs a
// decode of every message the engine publishes.
const MaxEndpointShares = 256

// addViewLocked adds src as a view of hub, the source holding src's address
// (nil: none yet, one is made). s.mu is held.
func (s *Subscriber) addViewLocked(hub, src *source) error {
	if hub == nil {
		hub = &source{addr: src.addr, engine: src.engine, replay: src.replay, snapshot: src.snapshot,
			noFilter: src.noFilter, share: true, hub: true, msgs: src.msgs}
		hub.views.Store(&[]*source{})
	}
	views := *hub.views.Load()
	if err := canShare(views, src); err != nil {
		return err
	}
	if len(views) >= MaxEndpointShares {
		return fmt.Errorf("kvevents: endpoint %q: %d endpoints share this address, the limit", src.addr, len(views))
	}
	src.conn, src.msgs = hub, nil
	next := append(slices.Clip(views), src)
	if len(views) == 0 {
		s.endpoints[src.addr] = hub
		s.order = append(s.order, src.addr)
	} else {
		s.sharedViews.Add(1)
	}
	if s.running && s.runCtx.Err() == nil {
		if hub.ctx == nil {
			hub.views.Store(&next)
			s.startEndpoint(hub) // starts every view's context too
			return nil
		}
		src.ctx, src.cancel = context.WithCancel(hub.ctx)
	}
	hub.views.Store(&next) // after src.ctx: the reader loads views, then reads ctx
	return nil
}

// canShare reports why src cannot read through the connection its sharers
// views have: the messages are one stream of bytes, so everything that
// decides how they are read must agree, and the pod must tell src's
// streams from theirs.
func canShare(views []*source, src *source) error {
	for _, v := range views {
		switch {
		case v.pod == src.pod:
			return fmt.Errorf("kvevents: endpoint %q already added for pod %q", src.addr, src.pod)
		case v.engine != src.engine, v.replay != src.replay, v.snapshot != src.snapshot, v.noFilter != src.noFilter:
			return fmt.Errorf("kvevents: endpoint %q is already added with another engine, replay or snapshot address, or topic "+
				"setting (pod %q: engine %s, replay %q, snapshot %q); sharers of one address must agree", src.addr, v.pod, v.engine, v.replay, v.snapshot)
		}
	}
	return nil
}

// handleView hands one message of a shared connection to view v.
func (s *Subscriber) handleView(v *source, peer string, frames [][]byte) {
	v.handling.Lock()
	defer v.handling.Unlock()
	if v.removed || v.ctx == nil {
		return
	}
	v.peer = peer
	s.handle(v.ctx, v, frames)
}

// targets are the sources src's messages go to: its views for a hub,
// itself otherwise.
func (src *source) targets() []*source {
	if src.hub {
		return *src.views.Load()
	}
	return []*source{src}
}

// sourceLocked is the source of the streams of pod that arrived through
// addr: the endpoint itself, or its view for pod when the address is
// shared. s.mu is held.
func (s *Subscriber) sourceLocked(addr, pod string) *source {
	src := s.endpoints[addr]
	if src == nil || !src.hub {
		return src
	}
	for _, v := range *src.views.Load() {
		if v.pod == pod {
			return v
		}
	}
	return nil
}

// RemoveEndpointPod removes the endpoint of pod at address: one sharer of a
// shared address (the connection stays for the others), or the endpoint
// itself when it names pod (RemoveEndpoint). Pod's streams from it are
// cleared as RemoveEndpoint clears them.
func (s *Subscriber) RemoveEndpointPod(address, pod string) error {
	s.mu.Lock()
	src, ok := s.endpoints[address]
	var v *source
	if ok && src.hub {
		views := *src.views.Load()
		i := slices.IndexFunc(views, func(v *source) bool { return v.pod == pod })
		if i >= 0 && len(views) > 1 {
			v = views[i]
			next := slices.Delete(slices.Clone(views), i, i+1)
			src.views.Store(&next)
			s.sharedViews.Add(-1)
		}
		ok = i >= 0
	} else if ok {
		ok = src.pod == pod
	}
	s.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("kvevents: %q pod %q: %w", address, pod, ErrUnknownEndpoint)
	case v == nil:
		return s.RemoveEndpoint(address) // its last (or only) reader
	}
	if v.cancel != nil {
		v.cancel() // ends a replay or snapshot exchange it is in
	}
	v.handling.Lock() // waits out the message in hand
	v.removed = true
	v.handling.Unlock()
	v.rebuilds.Wait()
	return s.clearEndpointStreams(address, pod)
}
