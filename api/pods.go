package api

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
)

// PodInfo is one (pod, DP rank) in the pod listing: the applier's view
// (what was applied, parity) joined with the subscriber's (sequence, endpoint).
type PodInfo struct {
	Pod              string  `json:"pod"`
	DPRank           int     `json:"dp_rank"`
	Model            string  `json:"model"`
	Endpoint         string  `json:"endpoint"`
	Engine           string  `json:"engine"`
	Role             string  `json:"role,omitempty"` // P/D role (llm-d.ai/role), when discovery or the endpoint says
	Blocks           int64   `json:"blocks"`         // -1 = index unavailable
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
	// Complete: the index has every batch of the engine's current lifetime
	// since its cache was last empty; otherwise it holds only what arrived
	// from complete_since_seq on, and incomplete_reason says why
	// (kvevents.StreamStats).
	Complete         bool   `json:"complete"`
	CompleteSinceSeq uint64 `json:"complete_since_seq"`
	IncompleteReason string `json:"incomplete_reason,omitempty"`
	Epoch            string `json:"epoch,omitempty"` // SGLang publisher lifetime
	UnverifiedReason string `json:"unverified_reason,omitempty"`
	// Blocks deliberately not indexed as the pod's own cache, and removals
	// that kept a block because another copy remains (applier.PodStats).
	RemoteBlocks        uint64 `json:"remote_blocks"`
	GroupSkippedBlocks  uint64 `json:"group_skipped_blocks"`
	CopiesKept          uint64 `json:"copies_kept"`
	FullAttentionGroups int    `json:"full_attention_groups"`
	// Stale: loaded from the snapshot at start and not scored until its
	// stream resumes.
	Stale bool `json:"stale,omitempty"`

	// ApplyLagSeconds: how late the index is for this pod, the age of its
	// oldest batch still waiting to be applied (kvevents.StreamStats).
	ApplyLagSeconds float64 `json:"apply_lag_seconds"`
}

// listPods joins the indexer's per-(pod, rank) view with the subscriber's
// stream statistics; a stream that delivered nothing yet is still listed.
func (s *Server) listPods(ctx context.Context) []PodInfo {
	var streams []kvevents.StreamStats
	var refs []indexer.PodRef
	if s.cfg.Subscriber != nil {
		streams = s.cfg.Subscriber.Streams()
		refs = make([]indexer.PodRef, len(streams))
		for i, st := range streams {
			refs[i] = indexer.PodRef{Name: st.Pod, DPRank: st.DPRank}
		}
	}
	pods := s.idx.Pods(ctx, refs)
	out := make([]PodInfo, len(pods))
	at := make(map[indexer.PodRef]int, len(pods))
	for i, ps := range pods {
		st := &ps.Stats
		p := &out[i]
		at[indexer.PodRef{Name: st.Pod, DPRank: st.DPRank}] = i
		*p = PodInfo{Pod: st.Pod, DPRank: st.DPRank, Model: st.Model, Engine: st.Engine.String(), Blocks: ps.Blocks,
			EventsApplied: st.EventsApplied, BlocksStored: st.BlocksStored, BlocksRemoved: st.BlocksRemoved,
			Clears: st.Clears, ParityMatches: st.ParityMatches, ParityMismatches: st.ParityMismatches,
			ParityUnverified: st.ParityUnverified, ParityHint: st.ParityHint, IndexErrors: st.IndexErrors,
			Untrusted: ps.Untrusted, UnverifiedReason: st.UnverifiedReason, RemoteBlocks: st.RemoteBlocks,
			GroupSkippedBlocks: st.GroupSkippedBlocks, CopiesKept: st.CopiesKept, FullAttentionGroups: st.FullAttentionGroups,
			Stale: ps.Stale}
		if !st.LastEvent.IsZero() {
			p.LastEvent = st.LastEvent.UTC().Format(time.RFC3339Nano)
			p.LastEventUnix = float64(st.LastEvent.UnixNano()) / 1e9
		}
	}
	for _, st := range streams {
		p := &out[at[indexer.PodRef{Name: st.Pod, DPRank: st.DPRank}]]
		if p.Model == "" {
			p.Model = st.Model
		}
		p.Endpoint = st.Endpoint
		p.Role = st.Role
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
		p.Complete, p.CompleteSinceSeq, p.IncompleteReason, p.Epoch = st.Complete, st.CompleteSinceSeq, st.IncompleteReason, st.Epoch
		p.ApplyLagSeconds = st.ApplyLag.Seconds()
	}
	return out
}

// splitStorage moves the storage sources (indexer.Config.StorageReaders)
// out of a pod listing: they are tiers of other pods, never a candidate a
// router could discover from the listing. A storage medium no source
// configures (indexer.StorageMedia: its batches are refused) is in neither.
func (s *Server) splitStorage(all []PodInfo) (pods, storage []PodInfo) {
	pods = make([]PodInfo, 0, len(all))
	for _, p := range all {
		switch {
		case s.idx.IsStorage(p.Pod):
			storage = append(storage, p)
		case slices.Contains(indexer.StorageMedia, p.Pod): // refused: listed nowhere
		default:
			pods = append(pods, p)
		}
	}
	return pods, storage
}

// EndpointInfo is one subscription in the endpoint listing and the body of
// POST /v1/endpoints.
type EndpointInfo struct {
	Address       string `json:"address"`
	Pod           string `json:"pod,omitempty"`
	Model         string `json:"model,omitempty"`
	Engine        string `json:"engine,omitempty"`
	ReplayAddress string `json:"replay_address,omitempty"`
	// SnapshotAddress is SGLang's snapshot_endpoint (snapshot-v1).
	SnapshotAddress string `json:"snapshot_address,omitempty"`
	Connected       bool   `json:"connected"`
	Bound           bool   `json:"bound"`
}

func (s *Server) listEndpoints() ([]EndpointInfo, *Error) {
	if s.cfg.Subscriber == nil {
		return nil, errorf(codes.Unimplemented, "no event subscriber is running")
	}
	eps := s.cfg.Subscriber.Endpoints()
	out := make([]EndpointInfo, 0, len(eps))
	for _, ep := range eps {
		out = append(out, EndpointInfo{Address: ep.Address, Pod: ep.Pod, Model: ep.Model,
			Engine: ep.Engine.String(), ReplayAddress: ep.ReplayAddress, SnapshotAddress: ep.SnapshotAddress,
			Connected: ep.Connected, Bound: ep.Bound})
	}
	return out, nil
}

// addEndpoint subscribes the endpoint ep describes and completes ep as the
// daemon holds it (address trimmed, engine named), for the answer.
func (s *Server) addEndpoint(ep *EndpointInfo) *Error {
	if !s.adminEnabled() {
		return errAdminOff
	}
	if s.cfg.Subscriber == nil {
		return errorf(codes.Unimplemented, "no event subscriber is running")
	}
	ep.Address = strings.TrimSpace(ep.Address)
	if ep.Address == "" {
		return errorf(codes.InvalidArgument, "address is required (e.g. tcp://10.0.0.7:5557)")
	}
	eng, ok := blockkeys.ParseEngine(ep.Engine)
	if !ok {
		return errorf(codes.InvalidArgument, "engine %q: want vllm, sglang or trtllm", ep.Engine)
	}
	if err := s.endpointPolicy().CheckEndpoint(context.Background(), ep.Address, ep.ReplayAddress, ep.SnapshotAddress); err != nil {
		return errorf(codes.InvalidArgument, "%v", err)
	}
	err := s.cfg.Subscriber.AddEndpoint(kvevents.EndpointConfig{Address: ep.Address, Pod: ep.Pod, Model: ep.Model,
		Engine: eng, ReplayAddress: ep.ReplayAddress, SnapshotAddress: ep.SnapshotAddress})
	if err != nil {
		return errorf(codes.InvalidArgument, "add endpoint %s: %v", ep.Address, err)
	}
	ep.Engine = eng.String()
	s.log.Info("endpoint added", "address", ep.Address, "pod", ep.Pod, "model", ep.Model, "engine", eng)
	return nil
}

func (s *Server) removeEndpoint(address string) *Error {
	if !s.adminEnabled() {
		return errAdminOff
	}
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
