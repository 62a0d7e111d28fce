package api

import (
	"encoding/json"
	"net/http"

	"google.golang.org/grpc/codes"
)

// jsonMuxErrors answers the requests mux has no handler for (unknown path,
// wrong method) with the same JSON error body as every other failure, where
// http.ServeMux would write plain text.
func jsonMuxErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// Let the mux decide between 404 and 405 (and compute Allow), but
		// keep only its status and headers.
		c := &statusCapture{header: http.Header{}}
		h.ServeHTTP(c, r)
		switch c.status {
		case http.StatusMethodNotAllowed:
			allow := c.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeErrorStatus(w, http.StatusMethodNotAllowed, errorf(codes.Unimplemented,
				"method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
		case http.StatusNotFound:
			writeErrorStatus(w, http.StatusNotFound, errorf(codes.NotFound, "no such path: %s", r.URL.Path))
		default: // a redirect (path cleaning) or anything else: as the mux says
			mux.ServeHTTP(w, r)
		}
	})
}

// statusCapture records a handler's status and headers and drops its body.
type statusCapture struct {
	header http.Header
	status int
}

func (c *statusCapture) Header() http.Header { return c.header }

func (c *statusCapture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *statusCapture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return len(b), nil
}

// writeErrorStatus writes e as JSON with an explicit HTTP status (for the
// statuses no gRPC code maps to, such as 405 and 415).
func writeErrorStatus(w http.ResponseWriter, status int, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}{e.Msg, e.Code.String()})
}
