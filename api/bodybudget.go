package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/internal/bytebudget"
)

// Request bodies are bounded twice before they are decoded: each by a cap
// derived from the prompt cap (a body that could only carry a prompt
// --max-prompt-bytes refuses is not read at all), and all large ones
// together by a byte budget, so N clients sending the largest bodies at
// once cost the budget, not N bodies. A body and what is decoded from it
// live until the handler returns, so the budget is held until then.

const (
	// smallBody is what a request may send without the budget: ordinary
	// scores (a few KB to ~1 MB) never wait behind large bodies.
	smallBody = 1 << 20
	// bodyWait is how long a large body waits for room before 503, as a
	// prompt waits for the tokenizer's budget.
	bodyWait = 2 * time.Second
	// minBodyCap keeps the derived cap above the largest token_ids or
	// block_hashes body (1,048,576 ids of up to 10 digits: ~11 MB).
	minBodyCap = 16 << 20
	// promptEscape is how much larger than the prompt its JSON may be:
	// Python's json.dumps writes every non-ASCII character as \uXXXX, 6
	// bytes for 3 of UTF-8 (12 for 4 with a surrogate pair).
	promptEscape = 3
)

// DefaultBodyBudget is the default of --http-body-budget-bytes.
const DefaultBodyBudget = 64 << 20

// bodyCap is the largest request body read: --http-max-body-bytes, lowered
// to what the largest prompt needs when --max-prompt-bytes is set.
func (s *Server) bodyCap() int64 {
	c := int64(maxBodyBytes)
	if m := s.cfg.MaxBodyBytes; m > 0 {
		c = min(c, m)
	}
	if p := int64(s.cfg.MaxPromptBytes); p > 0 {
		c = min(c, max(minBodyCap, promptEscape*p+1<<20))
	}
	return c
}

// GRPCMaxRecvMsgSize is the largest gRPC request message: the derived cap
// without --http-max-body-bytes (64 MiB when --max-prompt-bytes is 0).
func (s *Server) GRPCMaxRecvMsgSize() int {
	c := int64(maxBodyBytes)
	if p := int64(s.cfg.MaxPromptBytes); p > 0 {
		c = min(c, max(minBodyCap, promptEscape*p+1<<20))
	}
	return int(c)
}

// newBodyBudget sizes the budget: at least one body at the cap fits.
func (s *Server) newBodyBudget() *bytebudget.Budget {
	size := s.cfg.BodyBudgetBytes
	if size <= 0 {
		size = DefaultBodyBudget
	}
	return bytebudget.New(int(max(size, s.bodyCap())), s.metrics.bodyInflight)
}

// bodyReserve is what r takes from the budget: nothing for a small body
// of known length, its length for a larger one, the cap for a body of
// unknown length (chunked).
func bodyReserve(r *http.Request, capBytes int64) int64 {
	switch {
	case !hasBody(r):
		return 0
	case r.ContentLength >= 0 && r.ContentLength <= smallBody:
		return 0
	case r.ContentLength > 0:
		return r.ContentLength
	}
	return capBytes
}

// admitBody caps r's body and takes its share of the body budget; done
// gives it back (nil when the request was answered here).
func (s *Server) admitBody(w http.ResponseWriter, r *http.Request) (done func()) {
	capBytes := s.bodyCap()
	if r.ContentLength > capBytes {
		writeError(w, errorf(codes.ResourceExhausted, "request body of %d bytes is above the limit of %d%s", r.ContentLength, capBytes, s.capWhy(capBytes)))
		return nil
	}
	if capBytes < maxBodyBytes && hasBody(r) {
		r.Body = http.MaxBytesReader(w, r.Body, capBytes)
	}
	n := bodyReserve(r, capBytes)
	if n == 0 {
		return func() {}
	}
	if err := s.bodies.Acquire(r.Context(), int(n), bodyWait); err != nil {
		if errors.Is(err, bytebudget.ErrBusy) {
			s.metrics.bodyBudgetRejected.Inc()
			w.Header().Set("Retry-After", "1")
			writeErrorStatus(w, http.StatusServiceUnavailable, errorf(codes.Unavailable,
				"the bodies of the requests in progress are at --http-body-budget-bytes (%d); retry", s.bodies.Size()))
			return nil
		}
		writeError(w, errorf(codes.Canceled, "%v", err))
		return nil
	}
	return func() { s.bodies.Release(int(n)) }
}

// capWhy names where a cap below --http-max-body-bytes comes from.
func (s *Server) capWhy(capBytes int64) string {
	if s.cfg.MaxPromptBytes > 0 && capBytes < s.cfg.MaxBodyBytes {
		return " (" + strconv.Itoa(promptEscape) + " x --max-prompt-bytes + 1 MiB, at least 16 MiB)"
	}
	return ""
}
