package api

import (
	"net/http"
	"sort"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
)

// ModelInfo is one model in GET /v1/models: the prediction check of its
// scored requests (see indexer.PredictionConfig) and the quality of its
// picks (indexer.ModelQuality).
type ModelInfo struct {
	Model      string          `json:"model"`
	Prediction PredictionStats `json:"prediction"`
	// Picks is nil for a model nobody picked for.
	Picks *PickQuality `json:"picks,omitempty"`
}

// PredictionStats counts the predicted blocks of sampled score requests.
type PredictionStats struct {
	Predicted uint64 `json:"predicted_blocks"`
	Seen      uint64 `json:"seen_blocks"`
	Missed    uint64 `json:"missed_blocks"`
	Pending   uint64 `json:"pending_blocks"`
	// MissRate is missed / (seen + missed); near 1 means kvindex computes
	// other blocks than the engines store for the requests it scores.
	MissRate float64 `json:"miss_rate"`
	Hint     string  `json:"hint,omitempty"`
}

// PickQuality is a model's decision quality: what its picks found and
// chose (the kvindexd_pick_* series per model), with a short history for
// the status page and the picked pods with their engines' feedback.
type PickQuality struct {
	Picks            uint64            `json:"picks"`
	PrefixHeld       uint64            `json:"prefix_held"`
	AffinityPressure uint64            `json:"affinity_pressure"`
	Cold             uint64            `json:"cold"`
	PromptBlocks     uint64            `json:"prompt_blocks"`
	CachedBlocks     uint64            `json:"cached_blocks"`
	CachedShare      float64           `json:"cached_share"`
	TierBlocks       map[string]uint64 `json:"tier_blocks"`
	PromptMismatches uint64            `json:"prompt_mismatches"`
	StepSeconds      int               `json:"step_seconds"`
	History          []QualityStep     `json:"history"`
	Pods             []PodPickQuality  `json:"pods"`
}

// QualityStep is one step of PickQuality.History.
type QualityStep struct {
	Start            int64  `json:"start"` // Unix seconds
	Picks            uint64 `json:"picks"`
	PromptBlocks     uint64 `json:"prompt_blocks"`
	CachedBlocks     uint64 `json:"cached_blocks"`
	AffinityPressure uint64 `json:"affinity_pressure"`
	Cold             uint64 `json:"cold"`
}

// PodPickQuality is one picked pod of a model.
type PodPickQuality struct {
	Pod          string            `json:"pod"`
	Picks        uint64            `json:"picks"`
	CachedBlocks uint64            `json:"cached_blocks"`
	TierBlocks   map[string]uint64 `json:"tier_blocks"`
	// Feedback: the engine's reported cached tokens against the index's
	// predictions (POST /v1/feedback).
	Feedback        uint64  `json:"feedback"`
	PredictedTokens uint64  `json:"predicted_tokens"`
	ReportedTokens  uint64  `json:"reported_tokens"`
	ErrorTokens     uint64  `json:"error_tokens"`
	Drift           float64 `json:"drift"`
	Alarm           bool    `json:"alarm"`
	Hint            string  `json:"hint,omitempty"`
}

func tierMap(t *[event.NumTiers]uint64) map[string]uint64 {
	m := make(map[string]uint64, len(t))
	for i, n := range t {
		if n > 0 {
			m[event.Tier(i).String()] = n
		}
	}
	return m
}

func pickQuality(q *indexer.ModelQuality) *PickQuality {
	out := &PickQuality{Picks: q.Picks, PrefixHeld: q.PrefixHeld, AffinityPressure: q.Pressure, Cold: q.Cold,
		PromptBlocks: q.PromptBlocks, CachedBlocks: q.CachedBlocks, CachedShare: q.CachedShare, TierBlocks: tierMap(&q.TierBlocks),
		PromptMismatches: q.PromptMismatches, StepSeconds: int(indexer.QualityStepDuration.Seconds()),
		History: make([]QualityStep, len(q.History)), Pods: make([]PodPickQuality, len(q.Pods))}
	for i, s := range q.History {
		out.History[i] = QualityStep{Start: s.Start, Picks: s.Picks, PromptBlocks: s.PromptBlocks, CachedBlocks: s.CachedBlocks,
			AffinityPressure: s.Pressure, Cold: s.Cold}
	}
	for i := range q.Pods {
		p := &q.Pods[i]
		out.Pods[i] = PodPickQuality{Pod: p.Pod, Picks: p.Picks, CachedBlocks: p.CachedBlocks, TierBlocks: tierMap(&p.TierBlocks),
			Feedback: p.Feedback, PredictedTokens: p.PredictedTokens, ReportedTokens: p.ReportedTokens, ErrorTokens: p.AbsErrorTokens,
			Drift: p.Drift, Alarm: p.Alarm, Hint: p.Hint}
	}
	return out
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	preds := s.idx.Predictions()
	out := struct {
		PredictionEnabled bool        `json:"prediction_enabled"`
		Models            []ModelInfo `json:"models"`
	}{s.idx.PredictionEnabled(), make([]ModelInfo, 0, len(preds))}
	at := map[string]int{}
	for _, p := range preds {
		at[p.Model] = len(out.Models)
		out.Models = append(out.Models, ModelInfo{Model: p.Model, Prediction: PredictionStats{
			Predicted: p.Predicted, Seen: p.Seen, Missed: p.Missed, Pending: p.Pending, MissRate: p.MissRate, Hint: p.Hint}})
	}
	qs := s.idx.Quality()
	for i := range qs {
		j, ok := at[qs[i].Model]
		if !ok {
			j = len(out.Models)
			out.Models = append(out.Models, ModelInfo{Model: qs[i].Model})
		}
		out.Models[j].Picks = pickQuality(&qs[i])
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })
	writeJSON(w, http.StatusOK, out)
}
