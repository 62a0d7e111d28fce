package indexer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

func recorded(t *testing.T) (*tracing.Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.New(tp), rec
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	if s == nil {
		return attribute.Value{}, false
	}
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// With the Redis index, a traced score's lookup has one client span per
// Redis round trip beneath it, naming the command only; background Redis
// work makes none; the event batch is a root span of its own with its pod,
// seq and blocks; and a traced pick names its decision.
func TestTraceRedisRoundTripsAndBatches(t *testing.T) {
	srv := redistest.Start(t)
	tr, rec := recorded(t)
	ix := newTestIndexer(t, Config{Index: IndexConfig{Redis: &redisindex.Config{URL: srv.URL(), Namespace: "traced"}}, Tracer: tr})
	toks := seqTokens(500, 4*testBlock)
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-a", Model: testModel, Seq: 9,
		Events: []event.Event{storeEvent(toks, 4, event.TierGPU)}})

	ctx, req := tr.Start(context.Background(), "request")
	var r Result
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: toks}, &r) // untraced caller: no spans
	if len(r.Pods) != 1 || r.Pods[0].MatchedBlocks != 4 {
		t.Fatalf("fixture: %s", summary(&r))
	}
	if err := ix.Score(ctx, &Query{Model: testModel, Kind: InputTokens, TokenIDs: toks}, &r); err != nil {
		t.Fatal(err)
	}
	var pr PickResult
	if err := ix.Pick(ctx, &PickQuery{Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: toks},
		Candidates: []Candidate{{Pod: "pod-b"}, {Pod: "pod-a"}}}, &pr); err != nil {
		t.Fatal(err)
	}
	req.End()
	time.Sleep(10 * time.Millisecond) // background Redis work would show up by now

	spans := rec.Ended()
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID().String()] = s
	}
	parentName := func(s sdktrace.ReadOnlySpan) string {
		if p, ok := byID[s.Parent().SpanID().String()]; ok {
			return p.Name()
		}
		return ""
	}
	var redisUnderLookup, lookups, picks, batches int
	for _, s := range spans {
		if s.Name() != tracing.SpanApply && s.Name() != "request" && !s.Parent().IsValid() {
			t.Errorf("%s is a root span: stages of an untraced request make none", s.Name())
		}
		switch {
		case s.Name() == tracing.SpanLookup && parentName(s) == "request":
			lookups++
		case s.Name() == tracing.SpanPick:
			picks++
			if v, _ := spanAttr(s, tracing.PickPod); v.AsString() != "pod-a" {
				t.Errorf("pick span names pod %q", v.AsString())
			}
			if v, _ := spanAttr(s, tracing.PickReason); v.AsString() == "" || v.AsString() != pr.Reason.String() {
				t.Errorf("pick span reason %q, answer's %q", v.AsString(), pr.Reason)
			}
			if v, _ := spanAttr(s, tracing.PickPolicy); v.AsString() != routing.Names()[0] && v.AsString() != pr.Policy {
				t.Errorf("pick span policy %q", v.AsString())
			}
		case s.Name() == tracing.SpanApply:
			batches++
			if s.Parent().IsValid() {
				t.Errorf("batch span has a parent")
			}
			for k, want := range map[attribute.Key]int64{tracing.EventSeq: 9, tracing.BlocksStored: 4, tracing.EventCount: 1} {
				if v, _ := spanAttr(s, k); v.AsInt64() != want {
					t.Errorf("batch span %s = %v, want %d", k, v.AsInt64(), want)
				}
			}
		}
		if v, ok := spanAttr(s, tracing.DBSystem); ok {
			if v.AsString() != "redis" {
				t.Errorf("db.system.name %q", v.AsString())
			}
			// A new connection's set-up (HELLO) is a child of the call
			// that opened it.
			parent := byID[s.Parent().SpanID().String()]
			_, underRedis := spanAttr(parent, tracing.DBSystem)
			if p := parentName(s); p != tracing.SpanLookup && p != tracing.SpanPick && p != tracing.SpanApply && !underRedis {
				t.Errorf("Redis span %q under %q: only request and batch work is traced", s.Name(), p)
			}
			if parentName(s) == tracing.SpanLookup {
				redisUnderLookup++
			}
			for _, kv := range s.Attributes() {
				if strings.Contains(kv.Value.String(), "traced:") {
					t.Errorf("Redis span %q carries a key: %s=%s", s.Name(), kv.Key, kv.Value.String())
				}
			}
		}
	}
	if lookups != 2 || picks != 1 || batches != 1 || redisUnderLookup < 2 {
		t.Errorf("lookups under the request %d (want 2), picks %d (want 1), batches %d (want 1), Redis spans under lookups %d (want >= 2)",
			lookups, picks, batches, redisUnderLookup)
	}
}

// Batch spans are paced: one per batchSpanEvery, whatever the burst.
func TestBatchSpansPaced(t *testing.T) {
	var s batchSampler
	t0 := time.Unix(1000, 0)
	var got []int
	for ms := 0; ms < 350; ms += 10 {
		if s.allow(t0.Add(time.Duration(ms) * time.Millisecond)) {
			got = append(got, ms)
		}
	}
	if fmt.Sprint(got) != "[0 100 200 300]" {
		t.Fatalf("allowed at %v ms, want [0 100 200 300]", got)
	}

	tr, rec := recorded(t)
	ix := newTestIndexer(t, Config{Tracer: tr})
	start := time.Now()
	for i := range 50 {
		ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-a", Model: testModel, Seq: uint64(i),
			Events: []event.Event{storeEvent(seqTokens(i*1000, testBlock), 1, event.TierGPU)}})
	}
	most := 1 + int(time.Since(start)/batchSpanEvery)
	n := 0
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanApply {
			n++
		}
	}
	if n < 1 || n > most {
		t.Fatalf("%d batch spans for a burst of 50, want 1..%d", n, most)
	}
}
