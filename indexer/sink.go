package indexer

import (
	"context"

	"github.com/kvindex/kvindex/kvevents/event"
)

// eventSink is where kvevents delivers engine batches: the applier, then
// the speculative entries the events answer. It is the one sink type, and
// it implements the whole event.Sink contract itself (checked below),
// so no capability of the applier can be lost between kvevents and the
// applier. It reports the applier's outcome and decides nothing about the
// pod's trust: kvevents records the outcome in the pod's stream state, the
// one owner of whether the pod may be served.
type eventSink struct{ indexer *Indexer }

var _ event.Sink = eventSink{}

func (s eventSink) Apply(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	return s.applyTraced(ctx, b)
}

// apply runs the batch through the applier, which drops the speculative
// entries the batch answers (Config.Answered: ix.dropAnswered) by the keys
// it indexed. The Dynamo translation table learns the batch's blocks first:
// a block the index holds is then always reachable by its Dynamo hash, so
// /query_by_hash never answers less than /query (observing after the apply
// left a window where it did). An entry learned for a block the apply then
// drops matches nothing in the index and is swept like any other.
func (s eventSink) apply(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	if s.indexer.refuseStorageClaim(b) {
		return event.ApplyOutcome{}
	}
	s.indexer.observeDynamo(b)
	o := s.indexer.applier.Apply(ctx, b)
	s.indexer.reportEvicted()
	return o
}

// reportEvicted marks the streams of the pods the index evicted blocks of
// (Backend.Evicted) incomplete: every pod whose blocks were dropped for
// capacity says so in its answers, whichever pod's batch made the room.
// One atomic load when nothing was evicted; the buffer is reused under
// evictedMu (several apply workers).
func (ix *Indexer) reportEvicted() {
	if ix.backend.Evicted == nil || ix.sub == nil {
		return
	}
	ix.evictedMu.Lock()
	defer ix.evictedMu.Unlock()
	ix.evictedBuf = ix.backend.Evicted(ix.evictedBuf[:0])
	for _, id := range ix.evictedBuf {
		name, rank := ix.in.PodName(id)
		ix.sub.MarkEvicted(name, rank)
		ix.m.evictedPods.Inc()
	}
}

// indexLost is the backend's loss report (Backend.Lost): counted, and every
// stream marked incomplete, since the backend cannot say whose entries it
// lost. It goes to the subscriber because the subscriber owns the streams'
// trust; the backend is the indexer's, so the indexer relays it.
func (ix *Indexer) indexLost(reason string) {
	ix.m.indexLost.WithLabelValues(reason).Inc()
	if ix.sub != nil {
		ix.sub.MarkIndexLost("index_lost")
	}
}

// ForgetPod drops what the applier holds for a pod kvevents expired.
func (s eventSink) ForgetPod(ctx context.Context, pod string, dpRank int) {
	s.indexer.applier.ForgetPod(ctx, pod, dpRank)
}
