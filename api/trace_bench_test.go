package api

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/kvindex/kvindex/internal/testkit/cputime"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/metadata"

	"github.com/kvindex/kvindex/internal/tracing"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// discardExporter counts the spans the SDK hands it and drops them: the
// cost measured is the SDK's (spans, attributes, the batch processor's
// queue), not a network's.
type discardExporter struct{ spans atomic.Int64 }

func (e *discardExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(s)))
	return nil
}
func (e *discardExporter) Shutdown(context.Context) error { return nil }

// tracer is one of the two set-ups BenchmarkScoreTracing compares: "off"
// (the default: no tracer) and "on", every request sampled, through the
// batch span processor the daemon uses, into a discarding exporter.
func tracer(b *testing.B, mode string) *tracing.Tracer {
	if mode == "off" {
		return nil
	}
	exp := &discardExporter{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		if exp.spans.Load() == 0 {
			b.Error("tracing on exported no span")
		}
	})
	return tracing.New(tp)
}

const benchTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// BenchmarkScoreTracing is the score path of 512 blocks of token ids over
// 8 pods (BenchmarkHTTPScoreHandler, BenchmarkGRPCScoreMethod) with
// tracing off and on (100% sampled, the caller's traceparent given): the
// difference is what tracing costs per request (docs/performance.md).
func BenchmarkScoreTracing(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run("http/"+mode, func(b *testing.B) {
			st, prompt := benchStackTraced(b, 8, tracer(b, mode))
			body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": prompt})
			h := st.srv.Handler()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := httptest.NewRequest(http.MethodPost, "/v1/score", bytes.NewReader(body))
				req.Header.Set("traceparent", benchTraceparent)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatal(w.Body.String())
				}
			}
		})
		b.Run("grpc/"+mode, func(b *testing.B) {
			st, prompt := benchStackTraced(b, 8, tracer(b, mode))
			req := &kvindexv1.ScoreRequest{Model: testModel, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}}
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", benchTraceparent))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := st.srv.Score(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScoreTracingCPU runs the gRPC Score method (512 blocks of token
// ids, 8 pods, the caller's traceparent) with tracing off and on for b.N
// calls each on one locked OS thread and reports the thread CPU time per
// call of each and their difference: comparable on a loaded machine where
// ns/op is not. The batch span processor's own goroutine (queue to
// exporter) runs on other threads and is not in "on".
func BenchmarkScoreTracingCPU(b *testing.B) {
	req := func(prompt []uint32) *kvindexv1.ScoreRequest {
		return &kvindexv1.ScoreRequest{Model: testModel, Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}}
	}
	off, prompt := benchStackTraced(b, 8, nil)
	on, _ := benchStackTraced(b, 8, tracer(b, "on"))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", benchTraceparent))
	r := req(prompt)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Off and on alternate in rounds of 100 calls, so a neighbour's load
	// or a GC cycle falls on both alike.
	var spent [2]time.Duration
	servers := [2]*Server{off.srv, on.srv}
	b.ResetTimer()
	for done := 0; done < b.N; done += 100 {
		for i, s := range servers {
			t0, ok := cputime.Thread()
			if !ok {
				b.Skip("no per-thread CPU time on this system")
			}
			for range min(100, b.N-done) {
				if _, err := s.Score(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			t1, _ := cputime.Thread()
			spent[i] += t1 - t0
		}
	}
	offNs, onNs := float64(spent[0].Nanoseconds())/float64(b.N), float64(spent[1].Nanoseconds())/float64(b.N)
	b.ReportMetric(offNs, "off-cpu-ns/op")
	b.ReportMetric(onNs, "on-cpu-ns/op")
	b.ReportMetric(onNs-offNs, "on-minus-off-cpu-ns/op")
}
