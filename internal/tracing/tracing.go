// Package tracing is the daemon's OpenTelemetry tracing: a Tracer built
// from the standard OTEL_* environment variables only (FromEnv), the W3C
// trace context carried in from HTTP headers and gRPC metadata (Extract*),
// and a go-redis hook that times every round trip under the request's span
// (RedisHook).
//
// Tracing is off unless an exporter is configured. Off is a nil *Tracer:
// every method is nil-safe and then does nothing, allocates nothing and
// returns the context it was given, so the score path pays one pointer test
// per stage (BenchmarkScoreTracing in package api measures it).
//
// Spans never carry prompt text, rendered text, chat messages or token ids:
// only counts, names (model, pod, policy) and outcomes. The callers set the
// attributes through the keys declared here so that list stays reviewable in
// one place.
package tracing

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the daemon makes.
const ScopeName = "github.com/kvindex/kvindex"

// Tracer starts the daemon's spans. A nil *Tracer is tracing off.
type Tracer struct {
	t    trace.Tracer
	prop propagation.TraceContext
	// shutdown flushes and stops the provider (nil for New's tracers,
	// whose provider the caller owns).
	shutdown func(context.Context) error
}

// New wraps a tracer provider the caller owns (tests, benchmarks, an
// embedding program with its own SDK set-up).
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName)}
}

// On reports whether spans are made at all.
func (t *Tracer) On() bool { return t != nil }

// noopSpan is what Start returns when tracing is off: a package value, so
// returning it as a trace.Span allocates nothing.
var noopSpan trace.Span = noop.Span{}

// Start starts a span as a child of ctx's span. Off, it returns ctx and a
// span that records nothing.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noopSpan
	}
	return t.t.Start(ctx, name, opts...)
}

// StartChild is Start for a stage of a request: a span only under a
// recording span in ctx. The stages of a request that is not traced (not
// sampled, or come through an entry point without a request span) make
// none, instead of a root span per stage.
func (t *Tracer) StartChild(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noopSpan
	}
	return t.t.Start(ctx, name, opts...)
}

// Shutdown flushes the spans still queued and stops the exporter. Nil-safe.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Fail marks span failed with a status description that is only the
// error's code name: error messages can quote what a request sent (a chat
// template's raise_exception, a malformed field), and no request content
// may leave in a span.
func Fail(span trace.Span, code string) {
	span.SetStatus(codes.Error, code)
}

// The environment variables FromEnv reads itself; the SDK and the OTLP
// exporters read the rest (OTEL_TRACES_SAMPLER(_ARG), OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_*, OTEL_BSP_*).
const (
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSampler        = "OTEL_TRACES_SAMPLER"
	EnvSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
)

// Settings is what FromEnv decided, for the start-up log line.
type Settings struct {
	Exporter string // "none" or "otlp"
	Protocol string // "grpc" or "http/protobuf" when Exporter is "otlp"
	Sampler  string
}

// Config decides from the environment whether tracing is on and how; it
// does not connect anywhere. getenv is os.Getenv in the daemon.
//
// Off by default: with OTEL_TRACES_EXPORTER unset, tracing is on only when
// an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). The specification's default exporter
// is otlp to localhost; a daemon that starts sending spans to a port nobody
// asked for would be a surprise, so an explicit choice is required.
func Config(getenv func(string) string) (Settings, error) {
	if v := strings.TrimSpace(getenv(EnvSDKDisabled)); strings.EqualFold(v, "true") {
		return Settings{Exporter: "none"}, nil
	}
	exp := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter)))
	if exp == "" {
		exp = "none"
		if getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != "" {
			exp = "otlp"
		}
	}
	switch exp {
	case "none":
		return Settings{Exporter: "none"}, nil
	case "otlp":
	default:
		return Settings{}, fmt.Errorf("%s=%q: kvindexd exports traces with otlp only (or none)", EnvTracesExporter, exp)
	}
	proto := strings.ToLower(strings.TrimSpace(getenv(EnvTracesProtocol)))
	if proto == "" {
		proto = strings.ToLower(strings.TrimSpace(getenv(EnvProtocol)))
	}
	if proto == "" {
		proto = "http/protobuf" // the specification's default
	}
	if proto != "grpc" && proto != "http/protobuf" {
		return Settings{}, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", proto)
	}
	sampler, err := checkSampler(getenv)
	if err != nil {
		return Settings{}, err
	}
	return Settings{Exporter: "otlp", Protocol: proto, Sampler: sampler}, nil
}

// checkSampler refuses a sampler the SDK would replace by its default with
// only a logged error: a typo must not silently trace everything.
func checkSampler(getenv func(string) string) (string, error) {
	name := strings.ToLower(strings.TrimSpace(getenv(EnvSampler)))
	arg := strings.TrimSpace(getenv(EnvSamplerArg))
	switch name {
	case "":
		return "parentbased_always_on", nil
	case "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return name, nil
	case "traceidratio", "parentbased_traceidratio":
		if arg == "" {
			return name + " 1.0", nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return "", fmt.Errorf("%s=%q: want a ratio in [0, 1]", EnvSamplerArg, arg)
		}
		return name + " " + arg, nil
	}
	return "", fmt.Errorf("%s=%q: want always_on, always_off, traceidratio, parentbased_always_on, "+
		"parentbased_always_off or parentbased_traceidratio", EnvSampler, name)
}

// FromEnv builds the tracer the environment asks for (see Config): nil when
// tracing is off. version is the service.version resource attribute;
// service.name defaults to "kvindexd" (OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override). The exporter connects lazily: an
// unreachable collector does not stop the daemon, its spans are dropped and
// the SDK reports the failure through the handler the caller installed.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Tracer, Settings, error) {
	st, err := Config(getenv)
	if err != nil || st.Exporter == "none" {
		return nil, st, err
	}
	var exp sdktrace.SpanExporter
	if st.Protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, st, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// Later options win: the environment's service.name over the default.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "kvindexd"), attribute.String("service.version", version)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, st, fmt.Errorf("trace resource (%s, OTEL_RESOURCE_ATTRIBUTES): %w", "OTEL_SERVICE_NAME", err)
	}
	// The sampler and the batch processor's bounds come from the
	// environment (OTEL_TRACES_SAMPLER, OTEL_BSP_*), read by the SDK.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t := New(tp)
	t.shutdown = tp.Shutdown
	return t, st, nil
}
