package indexer

import (
	"context"

	"github.com/kvindex/kvindex/kvindex"
)

// eventSink is where kvevents delivers engine batches: the gate of pods
// restored from a snapshot, the applier, then the speculative entries the
// events answer. It is the one sink type, and it implements the whole
// kvindex.BatchSink contract itself (checked below), so no capability of
// the applier can be lost between kvevents and the applier.
type eventSink struct{ x *Indexer }

var _ kvindex.BatchSink = eventSink{}

func (s eventSink) Apply(ctx context.Context, b *kvindex.Batch) {
	x := s.x
	if x.gate.pending.Load() != 0 {
		x.resume(ctx, b)
	}
	x.applier.Apply(ctx, b)
	x.dropAnswered(ctx, b)
}

// ForgetPod drops what the applier holds for a pod kvevents expired.
func (s eventSink) ForgetPod(ctx context.Context, pod string, dpRank int) {
	s.x.applier.ForgetPod(ctx, pod, dpRank)
}
