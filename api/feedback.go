package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// FeedbackBody is POST /v1/feedback: a Pick answer's pick_id and what the
// chosen engine reported for the request (vLLM:
// usage.prompt_tokens_details.cached_tokens and usage.prompt_tokens;
// SGLang: meta_info.cached_tokens and meta_info.prompt_tokens).
type FeedbackBody struct {
	PickID       string `json:"pick_id"`
	CachedTokens *int64 `json:"cached_tokens"`
	PromptTokens int64  `json:"prompt_tokens,omitempty"`
}

// FeedbackAnswer is the comparison the daemon made.
type FeedbackAnswer struct {
	Model           string `json:"model"`
	Pod             string `json:"pod"`
	PredictedTokens int    `json:"predicted_tokens"`
	ReportedTokens  int    `json:"reported_tokens"`
	Disagrees       bool   `json:"disagrees"`
}

// FormatPickID is the wire form of a pick id: 16 hex digits (a JSON number
// would lose bits in JavaScript).
func FormatPickID(id uint64) string {
	var b [16]byte
	return string(appendPickID(b[:0], id))
}

func appendPickID(b []byte, id uint64) []byte {
	const hex = "0123456789abcdef"
	for sh := 60; sh >= 0; sh -= 4 {
		b = append(b, hex[(id>>uint(sh))&0xf])
	}
	return b
}

// parsePickID reads FormatPickID's form.
func parsePickID(s string) (uint64, *Error) {
	if s == "" {
		return 0, errorf(codes.InvalidArgument, "pick_id is required: the pick_id of the Pick answer")
	}
	id, err := strconv.ParseUint(s, 16, 64)
	if len(s) != 16 || err != nil || id == 0 {
		return 0, errorf(codes.InvalidArgument, "pick_id %q is not a pick id (16 hex digits)", truncate(s, 40))
	}
	return id, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// feedback checks and applies one feedback.
func (s *Server) feedback(pickID string, cached, prompt int64) (indexer.FeedbackResult, *Error) {
	id, e := parsePickID(pickID)
	if e != nil {
		s.idx.RejectFeedback()
		return indexer.FeedbackResult{}, e
	}
	if cached < 0 || prompt < 0 || cached > indexer.MaxInputLen || prompt > indexer.MaxInputLen {
		s.idx.RejectFeedback()
		return indexer.FeedbackResult{}, errorf(codes.InvalidArgument, "cached_tokens %d and prompt_tokens %d must be in [0, %d]",
			cached, prompt, indexer.MaxInputLen)
	}
	res, err := s.idx.Feedback(indexer.Feedback{PickID: id, CachedTokens: int(cached), PromptTokens: int(prompt)})
	if err != nil {
		return res, fromIndexer(err)
	}
	return res, nil
}

func (s *Server) handleFeedback(w http.ResponseWriter, r *http.Request) {
	var body FeedbackBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<12))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		s.idx.RejectFeedback()
		writeError(w, errorf(codes.InvalidArgument, "invalid JSON body: %v", err))
		return
	}
	if body.CachedTokens == nil {
		s.idx.RejectFeedback()
		writeError(w, errorf(codes.InvalidArgument, "cached_tokens is required: the engine's reported cached prompt tokens"))
		return
	}
	res, e := s.feedback(body.PickID, *body.CachedTokens, body.PromptTokens)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, FeedbackAnswer{Model: res.Model, Pod: res.Pod, PredictedTokens: res.PredictedTokens,
		ReportedTokens: res.ReportedTokens, Disagrees: res.Disagrees})
}

// Feedback implements kvindex.v1.Indexer/Feedback.
func (s *Server) Feedback(_ context.Context, req *kvindexv1.FeedbackRequest) (*kvindexv1.FeedbackResponse, error) {
	res, e := s.feedback(req.GetPickId(), int64(req.GetCachedTokens()), int64(req.GetPromptTokens()))
	if e != nil {
		return nil, e.grpc()
	}
	return &kvindexv1.FeedbackResponse{Model: res.Model, Pod: res.Pod, PredictedTokens: int32(res.PredictedTokens),
		ReportedTokens: int32(res.ReportedTokens), Disagrees: res.Disagrees}, nil
}
