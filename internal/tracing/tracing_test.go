package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// Off unless configured; the standard variables decide exporter, protocol
// and sampler; values the SDK would silently replace are start-up errors.
func TestConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		want Settings
		err  string
	}{
		{name: "nothing set", want: Settings{Exporter: "none"}},
		{name: "sampler alone", env: []string{EnvSampler, "always_on"}, want: Settings{Exporter: "none"}},
		{name: "endpoint", env: []string{EnvEndpoint, "http://c:4318"},
			want: Settings{Exporter: "otlp", Protocol: "http/protobuf", Sampler: "parentbased_always_on"}},
		{name: "traces endpoint, grpc", env: []string{EnvTracesEndpoint, "http://c:4317", EnvProtocol, "grpc"},
			want: Settings{Exporter: "otlp", Protocol: "grpc", Sampler: "parentbased_always_on"}},
		{name: "traces protocol wins", env: []string{EnvTracesExporter, "otlp", EnvProtocol, "grpc", EnvTracesProtocol, "http/protobuf"},
			want: Settings{Exporter: "otlp", Protocol: "http/protobuf", Sampler: "parentbased_always_on"}},
		{name: "ratio", env: []string{EnvTracesExporter, "otlp", EnvSampler, "parentbased_traceidratio", EnvSamplerArg, "0.01"},
			want: Settings{Exporter: "otlp", Protocol: "http/protobuf", Sampler: "parentbased_traceidratio 0.01"}},
		{name: "exporter none wins", env: []string{EnvTracesExporter, "none", EnvEndpoint, "http://c:4318"}, want: Settings{Exporter: "none"}},
		{name: "disabled wins", env: []string{EnvSDKDisabled, "true", EnvTracesExporter, "otlp"}, want: Settings{Exporter: "none"}},
		{name: "console", env: []string{EnvTracesExporter, "console"}, err: "otlp only"},
		{name: "json", env: []string{EnvTracesExporter, "otlp", EnvProtocol, "http/json"}, err: "want grpc or http/protobuf"},
		{name: "sampler typo", env: []string{EnvTracesExporter, "otlp", EnvSampler, "always-on"}, err: "OTEL_TRACES_SAMPLER"},
		{name: "ratio out of range", env: []string{EnvTracesExporter, "otlp", EnvSampler, "traceidratio", EnvSamplerArg, "2"}, err: "[0, 1]"},
	} {
		got, err := Config(env(c.env...))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	tr, _, err := FromEnv(context.Background(), env(), "v")
	if tr != nil || err != nil {
		t.Fatalf("FromEnv with nothing set: %v, %v; want off", tr, err)
	}
}

// Off is a nil Tracer: nothing is made and the context is returned as is.
func TestOffIsFree(t *testing.T) {
	var tr *Tracer
	ctx := context.Background()
	h := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	if n := testing.AllocsPerRun(100, func() {
		c, s := tr.Start(ctx, "x")
		if c != ctx || s.IsRecording() {
			t.Fatal("off made a span")
		}
		s.End()
		if tr.ExtractHTTP(ctx, h) != ctx {
			t.Fatal("off extracted a parent")
		}
		_ = tr.ExtractGRPC(ctx)
	}); n != 0 {
		t.Fatalf("off allocates %v times", n)
	}
	if tr.RedisHook("127.0.0.1:6379") != nil || tr.On() || tr.Shutdown(ctx) != nil {
		t.Fatal("off has a hook, is on, or fails to shut down")
	}
}

// The caller's traceparent from HTTP headers and gRPC metadata is the parent.
func TestExtractParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	h := http.Header{}
	h.Set("traceparent", parent)
	h.Set("tracestate", "router=kv")
	_, s1 := tr.Start(tr.ExtractHTTP(context.Background(), h), "http")
	s1.End()
	md := metadata.Pairs("traceparent", parent)
	_, s2 := tr.Start(tr.ExtractGRPC(metadata.NewIncomingContext(context.Background(), md)), "grpc")
	s2.End()
	_, s3 := tr.Start(tr.ExtractHTTP(context.Background(), http.Header{}), "no parent")
	s3.End()
	for _, s := range rec.Ended() {
		p := s.Parent()
		if s.Name() == "no parent" {
			if p.IsValid() {
				t.Errorf("a request without traceparent got parent %v", p.SpanID())
			}
			continue
		}
		if p.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || p.SpanID().String() != "b7ad6b7169203331" || !p.IsRemote() {
			t.Errorf("%s: parent %v/%v remote=%v", s.Name(), p.TraceID(), p.SpanID(), p.IsRemote())
		}
		if s.Name() == "http" && s.SpanContext().TraceState().Get("router") != "kv" {
			t.Errorf("tracestate lost: %q", s.SpanContext().TraceState().String())
		}
	}
}
