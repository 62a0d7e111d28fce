package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Usage is what an engine reported about a request's prompt once it
// answered: ParseUsage reads it from the engine's response.
type Usage struct {
	// CachedTokens: prompt tokens the engine did not compute (its prefix
	// cache hit).
	CachedTokens int
	// PromptTokens: the prompt's length in the engine's tokens; 0 = unknown.
	PromptTokens int
}

// ParseUsage reads the usage of a vLLM or SGLang response body: the
// OpenAI-compatible "usage": {"prompt_tokens", "prompt_tokens_details":
// {"cached_tokens"}} (vLLM; SGLang with --enable-cache-report), or SGLang's
// native "meta_info": {"prompt_tokens", "cached_tokens"}. For a streamed
// response pass the last chunk that carries usage. ok is false when the
// body reports no cached tokens (vLLM without prefix-caching stats, or
// SGLang without the cache report).
func ParseUsage(body []byte) (u Usage, ok bool) {
	var r struct {
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		MetaInfo *struct {
			PromptTokens int  `json:"prompt_tokens"`
			CachedTokens *int `json:"cached_tokens"`
		} `json:"meta_info"`
	}
	if json.Unmarshal(body, &r) != nil {
		return Usage{}, false
	}
	switch {
	case r.Usage != nil && r.Usage.Details != nil && r.Usage.Details.CachedTokens != nil:
		return Usage{CachedTokens: *r.Usage.Details.CachedTokens, PromptTokens: r.Usage.PromptTokens}, true
	case r.MetaInfo != nil && r.MetaInfo.CachedTokens != nil:
		return Usage{CachedTokens: *r.MetaInfo.CachedTokens, PromptTokens: r.MetaInfo.PromptTokens}, true
	}
	return Usage{}, false
}

// FeedbackResult is the daemon's comparison of one feedback.
type FeedbackResult struct {
	Model, Pod                      string
	PredictedTokens, ReportedTokens int
	// Disagrees: the index's prediction and the engine's report differ
	// by a block or more.
	Disagrees bool
}

// ErrNoPickID is Feedback's answer for a fallback decision: the daemon
// did not decide, so there is nothing to compare.
var ErrNoPickID = errors.New("client: the decision has no pick id (fallback)")

// Feedback hands the engine's usage for a picked request back to the
// daemon, which measures its predictions against it (drift alarm,
// kvindexd_feedback_* metrics). Call it once per decision, after the
// engine answered; a fallback decision returns ErrNoPickID without a call.
// It uses the client's per-call deadline.
func (c *Client) Feedback(ctx context.Context, d *Decision, u Usage) (*FeedbackResult, error) {
	if d == nil || d.PickID == "" {
		return nil, ErrNoPickID
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// beyond int32 is beyond any prompt: the daemon refuses it as invalid
	clamp := func(v int) int32 { return int32(min(max(v, -1), math.MaxInt32)) }
	resp, err := c.c.Feedback(ctx, &kvindexv1.FeedbackRequest{PickId: d.PickID, CachedTokens: clamp(u.CachedTokens), PromptTokens: clamp(u.PromptTokens)})
	if err != nil {
		return nil, fmt.Errorf("client: feedback: %w", err)
	}
	return &FeedbackResult{Model: resp.GetModel(), Pod: resp.GetPod(), PredictedTokens: int(resp.GetPredictedTokens()),
		ReportedTokens: int(resp.GetReportedTokens()), Disagrees: resp.GetDisagrees()}, nil
}
