package api

import (
	"context"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	indexerv1 "github.com/kvindex/kvindex/proto/llmd/indexer/v1"
)

func (e *Error) grpc() error { return status.Error(e.Code, e.Msg) }

// Score implements kvindex.v1.Indexer/Score.
func (s *Server) Score(ctx context.Context, req *kvindexv1.ScoreRequest) (*kvindexv1.ScoreResponse, error) {
	ctx, span := s.startGRPC(ctx, spanGRPCScore, grpcMethodScr)
	start := time.Now()
	// q stays on the stack (score does not retain it): no pool needed.
	q := indexer.Query{Model: req.GetModel(), LoraName: req.GetLoraName(), CacheSalt: req.GetCacheSalt(), Pods: req.GetPods(),
		SessionID: req.GetSessionId()}
	if kind, e := setGRPCInput(&q, req.GetInput(), req.AddSpecialTokens); e != nil {
		s.metrics.observeRequest(kind, e.Code, 0)
		endRequest(span, true, nil, e)
		return nil, e.grpc()
	}
	s.stage(indexer.OpScore, indexer.StageParse, start)
	a, err := s.score(ctx, &q)
	endRequest(span, true, &q, err)
	if err != nil {
		return nil, err.grpc()
	}
	defer putResult(a)
	start = time.Now()
	resp := toProtoScore(a)
	s.stage(indexer.OpScore, indexer.StageEncode, start)
	return resp, nil
}

// setGRPCInput sets q's input from the input oneof of a Score or a Pick
// request (in is either's GetInput(): their oneofs have the same fields
// under different wrapper types) and then the request's add_special_tokens.
// Both RPCs go through it, so each input is read, and a JSON input decoded,
// exactly once. On failure kind is the input kind the request metrics count
// it under.
func setGRPCInput(q *indexer.Query, in any, addSpecial *bool) (kind indexer.InputKind, e *Error) {
	var (
		tokens *kvindexv1.TokenIDs
		hashes *kvindexv1.BlockHashes
		text   string
		openAI bool
	)
	switch in := in.(type) {
	case *kvindexv1.ScoreRequest_TokenIds:
		kind, tokens = indexer.InputTokens, in.TokenIds
	case *kvindexv1.PickRequest_TokenIds:
		kind, tokens = indexer.InputTokens, in.TokenIds
	case *kvindexv1.ScoreRequest_BlockHashes:
		kind, hashes = indexer.InputHashes, in.BlockHashes
	case *kvindexv1.PickRequest_BlockHashes:
		kind, hashes = indexer.InputHashes, in.BlockHashes
	case *kvindexv1.ScoreRequest_Prompt:
		kind, text = indexer.InputPrompt, in.Prompt
	case *kvindexv1.PickRequest_Prompt:
		kind, text = indexer.InputPrompt, in.Prompt
	case *kvindexv1.ScoreRequest_ChatJson:
		kind, text = indexer.InputMessages, in.ChatJson
	case *kvindexv1.PickRequest_ChatJson:
		kind, text = indexer.InputMessages, in.ChatJson
	case *kvindexv1.ScoreRequest_OpenaiRequestJson:
		openAI, text = true, in.OpenaiRequestJson
	case *kvindexv1.PickRequest_OpenaiRequestJson:
		openAI, text = true, in.OpenaiRequestJson
	}
	switch {
	case openAI:
		// The body names its own kind: until it is decoded there is none.
		if err := q.SetOpenAIRequest([]byte(text)); err != nil {
			return indexer.InputNone, fromIndexer(err)
		}
	case kind == indexer.InputTokens:
		ids, e := tokenIDs(tokens)
		if e != nil {
			return kind, e
		}
		q.Kind, q.TokenIDs = kind, ids
	case kind == indexer.InputHashes:
		q.Kind, q.BlockHashes = kind, hashes.GetHashes()
	case kind == indexer.InputPrompt:
		q.Kind, q.Prompt = kind, text
	case kind == indexer.InputMessages:
		if err := q.SetChatJSON([]byte(text)); err != nil {
			return kind, fromIndexer(err)
		}
	}
	if e := setAddSpecialTokens(q, addSpecial, openAI); e != nil {
		return indexer.InputNone, e
	}
	return q.Kind, nil
}

// tokenIDs reads token_ids from ids (varints) or packed (little-endian
// uint32, read in place: no decoding, no copy on a little-endian machine).
func tokenIDs(t *kvindexv1.TokenIDs) ([]uint32, *Error) {
	packed := t.GetPacked()
	if len(packed) == 0 {
		return t.GetIds(), nil
	}
	if len(t.GetIds()) > 0 {
		return nil, errorf(codes.InvalidArgument, "token_ids: set ids or packed, not both")
	}
	ids, err := kvindexv1.UnpackTokenIDs(packed, nil)
	if err != nil {
		return nil, errorf(codes.InvalidArgument, "%v", err)
	}
	return ids, nil
}

// setAddSpecialTokens applies the request's add_special_tokens (nil =
// unset) to q once its input is set, with the rules of the HTTP body's
// field: an OpenAI body carries its own, and so may chat_json, so giving it
// twice is refused rather than one silently winning. token_ids and
// block_hashes are refused by the indexer's validation, as over HTTP.
func setAddSpecialTokens(q *indexer.Query, v *bool, openAI bool) *Error {
	switch {
	case v == nil:
		return nil
	case openAI:
		return errorf(codes.InvalidArgument, "openai_request_json carries the whole OpenAI body: give add_special_tokens inside it")
	case q.AddSpecialTokens != nil:
		return errorf(codes.InvalidArgument, "add_special_tokens is given both in chat_json and beside it")
	}
	q.AddSpecialTokens = v
	return nil
}

func toProtoScore(a *indexer.Result) *kvindexv1.ScoreResponse {
	resp := &kvindexv1.ScoreResponse{TotalBlocks: int32(a.TotalBlocks), UnscoredReason: a.UnscoredReason,
		IndexRebuildingPods: int32(min(a.IndexRebuilding, math.MaxInt32)),
		Pods:                make([]*kvindexv1.PodScore, len(a.Pods))}
	// One backing array per kind keeps allocations per response constant in
	// the number of pods.
	pods := make([]kvindexv1.PodScore, len(a.Pods))
	nRanks := 0
	for i := range a.Pods {
		nRanks += len(a.Pods[i].Ranks)
	}
	ranks := make([]kvindexv1.DPRankScore, nRanks)
	tiers := make([]kvindexv1.TierCounts, 2*(len(a.Pods)+nRanks)) // tiers and tier_runs
	rankPtrs := make([]*kvindexv1.DPRankScore, nRanks)
	r, t := 0, 0
	for i := range a.Pods {
		p := &a.Pods[i]
		ps := &pods[i]
		ps.Pod = p.Pod
		ps.MatchedBlocks = int32(p.MatchedBlocks)
		ps.MatchedTokens = p.MatchedTokens
		ps.Score = p.Score
		ps.Session = p.Session
		ps.ApplyLagSeconds, ps.Complete, ps.IncompleteReason = p.ApplyLag.Seconds(), p.Complete, p.IncompleteReason
		ps.Tiers = fillTiers(&tiers[t], &p.Tiers)
		ps.TierRuns = fillTiers(&tiers[t+1], &p.TierRuns)
		t += 2
		ps.DpRanks = rankPtrs[r : r : r+len(p.Ranks)]
		for j := range p.Ranks {
			rs := &p.Ranks[j]
			pr := &ranks[r]
			pr.DpRank = int32(rs.DPRank)
			pr.MatchedBlocks = int32(rs.MatchedBlocks)
			pr.Score = rs.Score
			pr.Tiers = fillTiers(&tiers[t], &rs.Tiers)
			pr.TierRuns = fillTiers(&tiers[t+1], &rs.TierRuns)
			t += 2
			ps.DpRanks = append(ps.DpRanks, pr)
			r++
		}
		resp.Pods[i] = ps
	}
	return resp
}

func fillTiers(dst *kvindexv1.TierCounts, t *indexer.TierCounts) *kvindexv1.TierCounts {
	dst.Gpu, dst.Cpu, dst.Disk, dst.External, dst.Shared = t[0], t[1], t[2], t[3], t[4]
	return dst
}

// ListPods implements kvindex.v1.Indexer/ListPods.
func (s *Server) ListPods(ctx context.Context, _ *kvindexv1.ListPodsRequest) (*kvindexv1.ListPodsResponse, error) {
	pods, _ := s.splitStorage(s.listPods(ctx))
	resp := &kvindexv1.ListPodsResponse{Pods: make([]*kvindexv1.PodInfo, len(pods))}
	for i, p := range pods {
		resp.Pods[i] = &kvindexv1.PodInfo{
			Pod: p.Pod, DpRank: int32(p.DPRank), Model: p.Model, Endpoint: p.Endpoint, Engine: p.Engine,
			Blocks: p.Blocks, EventsApplied: p.EventsApplied, LastEventUnix: p.LastEventUnix,
			SeqGaps: p.SeqGaps, Restarts: p.Restarts, ParityMatches: p.ParityMatches,
			ParityMismatches: p.ParityMismatches, ParityUnverified: p.ParityUnverified, ParityHint: p.ParityHint,
			Untrusted: p.Untrusted, BlocksStored: p.BlocksStored, BlocksRemoved: p.BlocksRemoved, Clears: p.Clears,
			IndexErrors: p.IndexErrors, LastSeq: p.LastSeq, Batches: p.Batches, MissedBatches: p.MissedBatches,
			DecodeErrors: p.DecodeErrors, Overflows: p.Overflows, ReplayedBatches: p.ReplayedBatches,
			Complete: p.Complete, CompleteSinceSeq: p.CompleteSinceSeq, IncompleteReason: p.IncompleteReason,
			Epoch: p.Epoch, UnverifiedReason: p.UnverifiedReason, RemoteBlocks: p.RemoteBlocks,
			GroupSkippedBlocks: p.GroupSkippedBlocks, CopiesKept: p.CopiesKept,
			FullAttentionGroups: int32(p.FullAttentionGroups), Stale: p.Stale, LastEvent: p.LastEvent,
			ApplyLagSeconds: p.ApplyLagSeconds, Role: p.Role,
		}
	}
	return resp, nil
}

// AddEndpoint implements kvindex.v1.Indexer/AddEndpoint.
func (s *Server) AddEndpoint(_ context.Context, req *kvindexv1.AddEndpointRequest) (*kvindexv1.AddEndpointResponse, error) {
	ep := req.GetEndpoint()
	if ep == nil {
		return nil, status.Error(codes.InvalidArgument, "endpoint is required")
	}
	if err := s.addEndpoint(&EndpointInfo{Address: ep.Address, Pod: ep.Pod, Model: ep.Model, Engine: ep.Engine,
		ReplayAddress: ep.ReplayAddress, SnapshotAddress: ep.SnapshotAddress}); err != nil {
		return nil, err.grpc()
	}
	return &kvindexv1.AddEndpointResponse{}, nil
}

// RemoveEndpoint implements kvindex.v1.Indexer/RemoveEndpoint.
func (s *Server) RemoveEndpoint(_ context.Context, req *kvindexv1.RemoveEndpointRequest) (*kvindexv1.RemoveEndpointResponse, error) {
	if err := s.removeEndpoint(req.GetAddress()); err != nil {
		return nil, err.grpc()
	}
	return &kvindexv1.RemoveEndpointResponse{}, nil
}

// ListEndpoints implements kvindex.v1.Indexer/ListEndpoints.
func (s *Server) ListEndpoints(context.Context, *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	eps, err := s.listEndpoints()
	if err != nil {
		return nil, err.grpc()
	}
	resp := &kvindexv1.ListEndpointsResponse{}
	for _, ep := range eps {
		resp.Endpoints = append(resp.Endpoints, &kvindexv1.Endpoint{Address: ep.Address, Pod: ep.Pod, Model: ep.Model,
			Engine: ep.Engine, ReplayAddress: ep.ReplayAddress, SnapshotAddress: ep.SnapshotAddress,
			Connected: ep.Connected, Bound: ep.Bound})
	}
	return resp, nil
}

// llmdService implements llm-d's indexer.v1.IndexerService on top of the
// same scoring path. llm-d keys scores by pod name; a pod with data-parallel
// ranks is reported once with its best rank in data_parallel_rank.
type llmdService struct {
	indexerv1.UnimplementedIndexerServiceServer
	server *Server
}

func (l *llmdService) GetPodScores(ctx context.Context, req *indexerv1.GetPodScoresRequest) (*indexerv1.GetPodScoresResponse, error) {
	q := &indexer.Query{Kind: indexer.InputPrompt, Model: req.GetModelName(), Prompt: req.GetPrompt(), Pods: req.GetPodIdentifiers()}
	a, err := l.server.score(ctx, q)
	if err != nil {
		return nil, err.grpc()
	}
	defer putResult(a)
	resp := &indexerv1.GetPodScoresResponse{Scores: make([]*indexerv1.PodScore, len(a.Pods))}
	for i := range a.Pods {
		p := &a.Pods[i]
		ps := &indexerv1.PodScore{Pod: p.Pod, Score: p.Score}
		best := p.Ranks[0].DPRank
		if best != 0 || len(p.Ranks) > 1 || l.server.idx.PodRanks(p.Pod) > 1 {
			r := int32(best)
			ps.DataParallelRank = &r
		}
		resp.Scores[i] = ps
	}
	return resp, nil
}
