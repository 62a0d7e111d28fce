package indexer

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvevents/event"
)

// batchSpanEvery paces the event-batch spans: at most one batch span per
// interval for the whole daemon. Engines publish hundreds of batches per
// second per pod; one span each would be most of the trace volume and
// cost the apply path more than the batch itself. A span every 100 ms
// still shows what a batch costs (and its Redis round trips) at any
// moment; the sampler (OTEL_TRACES_SAMPLER) then applies as to any root
// span.
const batchSpanEvery = 100 * time.Millisecond

// batchSampler lets one batch span through per batchSpanEvery.
type batchSampler struct{ next atomic.Int64 }

func (s *batchSampler) allow(now time.Time) bool {
	n := s.next.Load()
	t := now.UnixNano()
	return t >= n && s.next.CompareAndSwap(n, t+int64(batchSpanEvery))
}

// applyTraced applies b under a root span when the pacing lets it, else
// untraced.
func (s eventSink) applyTraced(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	ix := s.indexer
	if !ix.tr.On() || !ix.batchSpans.allow(time.Now()) {
		return s.apply(ctx, b)
	}
	stored, removed := 0, 0
	for i := range b.Events {
		switch e := &b.Events[i]; e.Kind {
		case event.BlockStored:
			stored += len(e.BlockHashes)
		case event.BlockRemoved:
			removed += len(e.BlockHashes)
		}
	}
	// A batch is not part of any request: a new trace.
	ctx, span := ix.tr.Start(ctx, tracing.SpanApply, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tracing.Pod.String(b.Pod), tracing.DPRank.Int(b.DPRank), tracing.GenAIModel.String(b.Model),
			tracing.EventSeq.Int64(int64(b.Seq)), tracing.EventCount.Int(len(b.Events)),
			tracing.BlocksStored.Int(stored), tracing.BlocksRemoved.Int(removed)))
	o := s.apply(ctx, b)
	if o.IndexFailed {
		span.SetAttributes(tracing.ApplyOutcome.String("index_failed"), tracing.ErrorType.String("index_failed"))
		tracing.Fail(span, "index_failed")
	} else {
		span.SetAttributes(tracing.ApplyOutcome.String("applied"))
	}
	span.End()
	return o
}

// endStage ends a stage span, marking it failed with the error's code.
func endStage(span trace.Span, err *Error) {
	if err != nil && span.IsRecording() {
		tracing.Fail(span, err.Code.String())
		span.SetAttributes(tracing.ErrorType.String(err.Code.String()))
	}
	span.End()
}
