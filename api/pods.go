package api

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex"
)

// PodInfo is one (pod, DP rank) in the pod listing: the applier's view
// (what was applied, parity) joined with the subscriber's (sequence, endpoint).
type PodInfo struct {
	Pod              string  `json:"pod"`
	DPRank           int     `json:"dp_rank"`
	Model            string  `json:"model"`
	Endpoint         string  `json:"endpoint"`
	Engine           string  `json:"engine"`
	Blocks           int64   `json:"blocks"` // -1 = index unavailable
	EventsApplied    uint64  `json:"events_applied"`
	BlocksStored     uint64  `json:"blocks_stored"`
	BlocksRemoved    uint64  `json:"blocks_removed"`
	Clears           uint64  `json:"clears"`
	LastEvent        string  `json:"last_event,omitempty"` // RFC 3339
	LastEventUnix    float64 `json:"last_event_unix"`
	LastSeq          uint64  `json:"last_seq"`
	Batches          uint64  `json:"batches"`
	SeqGaps          uint64  `json:"seq_gaps"`
	MissedBatches    uint64  `json:"missed_batches"`
	ReplayedBatches  uint64  `json:"replayed_batches"`
	Restarts         uint64  `json:"restarts"`
	DecodeErrors     uint64  `json:"decode_errors"`
	Overflows        uint64  `json:"overflows"`
	ParityMatches    uint64  `json:"parity_matches"`
	ParityMismatches uint64  `json:"parity_mismatches"`
	ParityUnverified uint64  `json:"parity_unverified"`
	ParityHint       string  `json:"parity_hint,omitempty"`
	IndexErrors      uint64  `json:"index_errors"`
	Untrusted        bool    `json:"untrusted"`
}

type podKey struct {
	name string
	rank int
}

// listPods joins applier and subscriber statistics per (pod, rank).
func (s *Server) listPods(ctx context.Context) []PodInfo {
	byKey := map[podKey]*PodInfo{}
	get := func(name string, rank int) *PodInfo {
		k := podKey{name, rank}
		p := byKey[k]
		if p == nil {
			p = &PodInfo{Pod: name, DPRank: rank, Engine: kvindex.EngineVLLM.String()}
			byKey[k] = p
		}
		return p
	}
	if s.cfg.Applier != nil {
		for _, st := range s.cfg.Applier.PodStats() {
			p := get(st.Pod, st.DPRank)
			p.Model = st.Model
			p.Engine = st.Engine.String()
			p.EventsApplied = st.EventsApplied
			p.BlocksStored = st.BlocksStored
			p.BlocksRemoved = st.BlocksRemoved
			p.Clears = st.Clears
			if !st.LastEvent.IsZero() {
				p.LastEvent = st.LastEvent.UTC().Format(time.RFC3339Nano)
				p.LastEventUnix = float64(st.LastEvent.UnixNano()) / 1e9
			}
			p.ParityMatches = st.ParityMatches
			p.ParityMismatches = st.ParityMismatches
			p.ParityUnverified = st.ParityUnverified
			p.ParityHint = st.ParityHint
			p.IndexErrors = st.IndexErrors
			p.Untrusted = st.Untrusted
		}
	}
	if s.cfg.Subscriber != nil {
		for _, st := range s.cfg.Subscriber.Streams() {
			p := get(st.Pod, st.DPRank)
			if p.Model == "" {
				p.Model = st.Model
			}
			p.Endpoint = st.Endpoint
			p.LastSeq = st.LastSeq
			p.Batches = st.Batches
			p.SeqGaps = st.SeqGaps
			p.MissedBatches = st.MissedBatches
			p.ReplayedBatches = st.ReplayedBatches
			if p.EventsApplied == 0 {
				p.Engine = st.Engine.String()
			}
			p.Restarts = st.Restarts
			p.DecodeErrors = st.DecodeErrors
			p.Overflows = st.Overflows
		}
	}
	out := make([]PodInfo, 0, len(byKey))
	for _, p := range byKey {
		p.Blocks = s.podBlocks(ctx, p.Pod, p.DPRank)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PodInfo) int {
		if c := cmp.Compare(a.Pod, b.Pod); c != 0 {
			return c
		}
		return cmp.Compare(a.DPRank, b.DPRank)
	})
	return out
}

// EndpointInfo is one subscription in the endpoint listing and the body of
// POST /v1/endpoints.
type EndpointInfo struct {
	Address       string `json:"address"`
	Pod           string `json:"pod,omitempty"`
	Model         string `json:"model,omitempty"`
	Engine        string `json:"engine,omitempty"`
	ReplayAddress string `json:"replay_address,omitempty"`
	Connected     bool   `json:"connected"`
	Bound         bool   `json:"bound"`
}

func (s *Server) listEndpoints() ([]EndpointInfo, *Error) {
	if s.cfg.Subscriber == nil {
		return nil, errorf(codes.Unimplemented, "no event subscriber is running")
	}
	eps := s.cfg.Subscriber.Endpoints()
	out := make([]EndpointInfo, 0, len(eps))
	for _, ep := range eps {
		out = append(out, EndpointInfo{Address: ep.Address, Pod: ep.Pod, Model: ep.Model,
			Engine: ep.Engine.String(), ReplayAddress: ep.ReplayAddress, Connected: ep.Connected, Bound: ep.Bound})
	}
	return out, nil
}

func (s *Server) addEndpoint(ep EndpointInfo) *Error {
	if s.cfg.Subscriber == nil {
		return errorf(codes.Unimplemented, "no event subscriber is running")
	}
	ep.Address = strings.TrimSpace(ep.Address)
	if ep.Address == "" {
		return errorf(codes.InvalidArgument, "address is required (e.g. tcp://10.0.0.7:5557)")
	}
	eng, ok := kvindex.ParseEngine(ep.Engine)
	if !ok {
		return errorf(codes.InvalidArgument, "engine %q: want vllm or sglang", ep.Engine)
	}
	err := s.cfg.Subscriber.AddEndpoint(kvevents.EndpointConfig{Address: ep.Address, Pod: ep.Pod, Model: ep.Model,
		Engine: eng, ReplayAddress: ep.ReplayAddress})
	if err != nil {
		return errorf(codes.InvalidArgument, "add endpoint %s: %v", ep.Address, err)
	}
	s.log.Info("endpoint added", "address", ep.Address, "pod", ep.Pod, "model", ep.Model, "engine", eng)
	return nil
}

func (s *Server) removeEndpoint(address string) *Error {
	if s.cfg.Subscriber == nil {
		return errorf(codes.Unimplemented, "no event subscriber is running")
	}
	if address == "" {
		return errorf(codes.InvalidArgument, "address is required")
	}
	if err := s.cfg.Subscriber.RemoveEndpoint(address); err != nil {
		code := codes.NotFound
		if !errors.Is(err, kvevents.ErrUnknownEndpoint) {
			code = codes.Unavailable // the subscriber is shutting down
		}
		return errorf(code, "remove endpoint %s: %v", address, err)
	}
	s.log.Info("endpoint removed", "address", address)
	return nil
}
