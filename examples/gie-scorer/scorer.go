// Command gie-scorer shows kvindexd as a scorer of a Gateway API Inference
// Extension endpoint picker: the scorer sends the request and the
// endpoints' load to the daemon's Pick and votes 1 for the pod it picks,
// 0 for the others, so a profile weighs the daemon's decision against its
// other scorers. When the daemon is unreachable the client's fallback
// (least loaded) is voted for instead: the picker keeps working.
//
// With -embedded the index runs inside the picker's process instead
// (package indexer): it subscribes to the engines' KV events itself and
// Pick is a function call, with the daemon's answers.
//
// It is a separate Go module so the daemon's own go.mod stays free of the
// endpoint picker's dependencies.
package main

import (
	"context"
	"log/slog"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/gie-scorer/gie"
)

// ScorerType is the plugin type name a picker configuration refers to.
const ScorerType = "kvindex-scorer"

// Scorer is a gie.Scorer backed by kvindexd, or by the index embedded in
// the picker's process (InProcess).
type Scorer struct {
	name   string
	c      Picker
	policy string
	log    *slog.Logger
}

// NewScorer scores through c (a *client.Client or InProcess) with the
// index's policy ("" = its default).
func NewScorer(name string, c Picker, policy string, log *slog.Logger) *Scorer {
	return &Scorer{name: name, c: c, policy: policy, log: log}
}

var _ gie.Scorer = (*Scorer)(nil)

func (s *Scorer) TypedName() gie.TypedName { return gie.TypedName{Type: ScorerType, Name: s.name} }

// Category is Affinity: the daemon's pick follows cached prefixes (it
// weighs load too, so the profile's load scorers can keep lower weights).
func (s *Scorer) Category() gie.ScorerCategory { return gie.Affinity }

// Score asks the daemon which endpoint should take req. Endpoints are
// named to the daemon by pod name, the name their engines publish KV
// events under.
func (s *Scorer) Score(ctx context.Context, _ *gie.CycleState, req *gie.LLMRequest, endpoints []gie.Endpoint) map[gie.Endpoint]float64 {
	scores, err := s.score(ctx, req, endpoints)
	if err != nil {
		// A request the daemon cannot route (e.g. no tokenizer for the
		// model): no opinion, the other scorers decide.
		s.log.Warn("kvindex pick failed", "request", req.RequestID, "err", err)
	}
	return scores
}

// score is Score with the daemon's refusal returned (every score is then 0).
func (s *Scorer) score(ctx context.Context, req *gie.LLMRequest, endpoints []gie.Endpoint) (map[gie.Endpoint]float64, error) {
	scores := make(map[gie.Endpoint]float64, len(endpoints))
	if len(endpoints) == 0 {
		return scores, nil
	}
	r := &client.Request{Model: req.TargetModel, Prompt: req.Prompt, Policy: s.policy,
		Candidates: make([]client.Candidate, len(endpoints))}
	for i, ep := range endpoints {
		m := ep.GetMetrics()
		r.Candidates[i] = client.Candidate{Pod: ep.GetMetadata().NamespacedName.Name,
			Waiting: m.WaitingQueueSize, Running: m.RunningRequestsSize, KVUsage: m.KVCacheUsagePercent}
		scores[ep] = 0
	}
	d, err := s.c.Pick(ctx, r)
	if err != nil {
		return scores, err
	}
	if d.Fallback {
		s.log.Debug("kvindex unreachable, voting least loaded", "err", d.Err)
	}
	scores[endpoints[d.Index]] = 1
	return scores, nil
}
