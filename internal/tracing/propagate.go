package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"
)

// ExtractHTTP returns ctx with the remote span context of the request's
// W3C traceparent/tracestate headers, so the caller's span (a router's) is
// the parent of the daemon's. Off, or without the headers, ctx is returned.
func (t *Tracer) ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	if t == nil || h.Get("traceparent") == "" {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.HeaderCarrier(h))
}

// ExtractGRPC is ExtractHTTP for the incoming gRPC metadata in ctx.
func (t *Tracer) ExtractGRPC(ctx context.Context) context.Context {
	if t == nil {
		return ctx
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md.Get("traceparent")) == 0 {
		return ctx
	}
	return t.prop.Extract(ctx, mdCarrier(md))
}

// mdCarrier reads gRPC metadata as a propagation carrier (keys are lower
// case in metadata, as W3C's header names are).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
