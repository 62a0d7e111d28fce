package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/redact"
)

// Error is a request failure with the gRPC code both transports map from
// (InvalidArgument -> HTTP 400, Unavailable -> 503, ...).
type Error struct {
	Code codes.Code
	Msg  string
	// Status overrides the HTTP status derived from Code (0 = derived):
	// ResourceExhausted is 413 for a body above the limit, 429 for a busy
	// shared budget.
	Status int
}

func (e *Error) Error() string { return e.Msg }

func errorf(c codes.Code, format string, args ...any) *Error {
	// Messages may quote addresses a client or the config gave (endpoint,
	// replay, Redis URLs): credentials in them never reach an answer.
	return &Error{Code: c, Msg: redact.String(fmt.Sprintf(format, args...))}
}

// grpcCodes maps the indexer's transport-neutral codes.
var grpcCodes = map[indexer.Code]codes.Code{
	indexer.InvalidArgument:    codes.InvalidArgument,
	indexer.FailedPrecondition: codes.FailedPrecondition,
	indexer.Unavailable:        codes.Unavailable,
	indexer.DeadlineExceeded:   codes.DeadlineExceeded,
	indexer.Canceled:           codes.Canceled,
	indexer.ResourceExhausted:  codes.ResourceExhausted,
	indexer.NotFound:           codes.NotFound,
}

// fromIndexer turns an indexer failure into a transport error; anything
// that is not an *indexer.Error is an internal error.
func fromIndexer(err error) *Error {
	var ie *indexer.Error
	if errors.As(err, &ie) {
		if c, ok := grpcCodes[ie.Code]; ok {
			e := &Error{Code: c, Msg: redact.String(ie.Msg)}
			if ie.Code == indexer.ResourceExhausted {
				e.Status = http.StatusTooManyRequests
			}
			return e
		}
	}
	return errorf(codes.Internal, "%v", err)
}

// resultPool keeps score results with their buffers between requests: the
// indexer fills a caller-owned Result so the hot path allocates nothing.
var resultPool = sync.Pool{New: func() any { return new(indexer.Result) }}

func putResult(r *indexer.Result) {
	r.Reset()
	resultPool.Put(r)
}

// score runs one request through the indexer and records its request
// metrics. The caller must putResult the result.
func (s *Server) score(ctx context.Context, q *indexer.Query) (*indexer.Result, *Error) {
	start := time.Now()
	r := resultPool.Get().(*indexer.Result)
	var e *Error
	if err := s.idx.Score(ctx, q, r); err != nil {
		putResult(r)
		r, e = nil, fromIndexer(err)
	}
	code := codes.OK
	if e != nil {
		code = e.Code
	}
	s.metrics.observeRequest(q.Kind, code, time.Since(start))
	return r, e
}
