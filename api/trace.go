package api

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/tracing"
)

// The request spans of Score and Pick on both transports, named as the
// semantic conventions name server spans. The caller's W3C trace context
// (traceparent, tracestate) makes its span the parent.
const (
	routeScore     = "/v1/score"
	routePick      = "/v1/pick"
	spanHTTPScore  = "POST " + routeScore
	spanHTTPPick   = "POST " + routePick
	grpcService    = "kvindex.v1.Indexer"
	spanGRPCScore  = grpcService + "/Score"
	spanGRPCPick   = grpcService + "/Pick"
	grpcMethodScr  = "Score"
	grpcMethodPick = "Pick"
)

// startHTTP starts the server span of an HTTP request (off: r's context and
// a span that records nothing).
func (s *Server) startHTTP(r *http.Request, name, route string) (context.Context, trace.Span) {
	if !s.tr.On() {
		return s.tr.Start(r.Context(), name) // r's context, a span that records nothing
	}
	ctx := s.tr.ExtractHTTP(r.Context(), r.Header)
	return s.tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(tracing.HTTPMethod.String(http.MethodPost), tracing.HTTPRoute.String(route)))
}

// startGRPC starts the server span of a gRPC call.
func (s *Server) startGRPC(ctx context.Context, name, method string) (context.Context, trace.Span) {
	if !s.tr.On() {
		return s.tr.Start(ctx, name)
	}
	ctx = s.tr.ExtractGRPC(ctx)
	return s.tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		tracing.RPCSystem.String("grpc"), tracing.RPCService.String(grpcService), tracing.RPCMethod.String(method)))
}

// endRequest ends a request span with what the request was (model, input
// kind) and how it ended; grpc says which status attribute applies. q may
// be nil (the request did not parse).
func endRequest(span trace.Span, grpc bool, q *indexer.Query, e *Error) {
	if !span.IsRecording() {
		return
	}
	code := codes.OK
	if e != nil {
		code = e.Code
	}
	if q != nil {
		span.SetAttributes(tracing.GenAIModel.String(q.Model), tracing.InputKind.String(q.Kind.String()))
	}
	if grpc {
		span.SetAttributes(tracing.RPCGRPCStatus.Int(int(code)))
	} else {
		status := http.StatusOK
		if e != nil {
			status = e.Status
			if status == 0 {
				status = httpStatus(e.Code)
			}
		}
		span.SetAttributes(tracing.HTTPStatus.Int(status))
	}
	if e != nil {
		span.SetAttributes(tracing.ErrorType.String(code.String()))
		tracing.Fail(span, code.String())
	}
	span.End()
}

// stage observes the time since start as stage st of op.
func (s *Server) stage(op indexer.Op, st indexer.Stage, start time.Time) {
	s.idx.ObserveStage(op, st, time.Since(start))
}
