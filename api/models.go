package api

import "net/http"

// ModelInfo is one model in GET /v1/models: the prediction check of its
// scored requests (see indexer.PredictionConfig).
type ModelInfo struct {
	Model      string          `json:"model"`
	Prediction PredictionStats `json:"prediction"`
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

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	preds := s.idx.Predictions()
	out := struct {
		PredictionEnabled bool        `json:"prediction_enabled"`
		Models            []ModelInfo `json:"models"`
	}{s.idx.PredictionEnabled(), make([]ModelInfo, 0, len(preds))}
	for _, p := range preds {
		out.Models = append(out.Models, ModelInfo{Model: p.Model, Prediction: PredictionStats{
			Predicted: p.Predicted, Seen: p.Seen, Missed: p.Missed, Pending: p.Pending, MissRate: p.MissRate, Hint: p.Hint}})
	}
	writeJSON(w, http.StatusOK, out)
}
