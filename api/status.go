package api

import (
	_ "embed"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
)

// statusPage is the operator page served on GET /: pods, a live chart of
// events/s and scores/s, and a form that scores a prompt or token ids. It
// is one self-contained file (no external assets) that polls /v1/status and
// /v1/pods and posts to /v1/score. With --auth-token-file the page is still
// served without a token and asks for one, which its script sends as a
// bearer header (kept in the tab's sessionStorage, never a cookie, so no
// other site can make a browser use it).
//
//go:embed status.html
var statusPage []byte

// Counter families the status page turns into rates.
const (
	eventsAppliedMetric = "kvindexd_events_applied_total"
	scoreRequestsMetric = "kvindexd_score_requests_total"
)

// Status is the answer of GET /v1/status: readiness and the counters the
// status page charts as rates (it divides their differences by the
// differences of Time, the server's clock, so client clock skew does not
// matter).
type Status struct {
	// Keys is the daemon's default block-key configuration.
	Keys *StatusKeys `json:"keys"`

	Time           float64 `json:"time"` // Unix seconds
	Ready          bool    `json:"ready"`
	NotReadyReason string  `json:"not_ready_reason,omitempty"`
	EventsApplied  uint64  `json:"events_applied"`
	ScoreRequests  uint64  `json:"score_requests"`
	// Build is the running binary's version (Config.Build).
	Build BuildInfo `json:"build"`
}

func (s *Server) handleStatusPage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// The page loads nothing from elsewhere; say so to the browser too.
	// It is served without a token (see httpScope) and takes one in a form:
	// no other site may frame it.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(statusPage)
}

func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	st := Status{Time: float64(time.Now().UnixNano()) / 1e9, Build: s.cfg.Build}
	st.Ready, st.NotReadyReason = s.Ready()
	st.Keys = s.statusKeys()
	// The counters are read from the registry rather than kept twice; a
	// gather is cheap at the page's poll rate.
	families, err := s.cfg.Registry.Gather()
	if err != nil {
		writeError(w, errorf(codes.Internal, "gather metrics: %v", err))
		return
	}
	for _, f := range families {
		switch f.GetName() {
		case eventsAppliedMetric:
			st.EventsApplied = sumCounter(f)
		case scoreRequestsMetric:
			st.ScoreRequests = sumCounter(f)
		}
	}
	writeJSON(w, http.StatusOK, st)
}

func sumCounter(f *dto.MetricFamily) uint64 {
	var sum float64
	for _, m := range f.GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return uint64(sum)
}
