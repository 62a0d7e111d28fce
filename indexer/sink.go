package indexer

import (
	"context"

	"github.com/kvindex/kvindex/kvevents/event"
)

// eventSink is where kvevents delivers engine batches: the gate of pods
// restored from a snapshot, the applier, then the speculative entries the
// events answer. It is the one sink type, and it implements the whole
// event.Sink contract itself (checked below), so no capability of
// the applier can be lost between kvevents and the applier.
type eventSink struct{ x *Indexer }

var _ event.Sink = eventSink{}

func (s eventSink) Apply(ctx context.Context, b *event.Batch) {
	x := s.x
	if x.gate.pending.Load() != 0 {
		x.resume(ctx, b)
	}
	x.applier.Apply(ctx, b)
	x.markUntrusted(b)
	x.dropAnswered(ctx, b)
}

// markUntrusted marks the batch's stream incomplete ("index_error") when a
// write of the pod failed: the applier clears such a pod and rebuilds it
// from later events only, so what it held before is gone from the index
// while the stream would still say complete. The mark lasts until an
// engine snapshot, clear or restart rebuilds the pod (kvevents).
func (x *Indexer) markUntrusted(b *event.Batch) {
	if x.sub == nil {
		return
	}
	if id, ok := x.in.LookupPod(b.Pod, b.DPRank); ok && !x.applier.Trusted(id) {
		x.sub.MarkPodIndexLost(b.Pod, b.DPRank, "index_error")
	}
}

// indexLost is the backend's loss report (Backend.Lost): counted, and every
// stream marked incomplete, since the backend cannot say whose entries it
// lost.
func (x *Indexer) indexLost(reason string) {
	x.m.indexLost.WithLabelValues(reason).Inc()
	if x.sub != nil {
		x.sub.MarkIndexLost("index_lost")
	}
}

// ForgetPod drops what the applier holds for a pod kvevents expired.
func (s eventSink) ForgetPod(ctx context.Context, pod string, dpRank int) {
	s.x.applier.ForgetPod(ctx, pod, dpRank)
}
