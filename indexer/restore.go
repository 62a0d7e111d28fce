package indexer

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// RestoredPod is a pod whose entries were loaded from a snapshot, with the
// last sequence number of its stream that the snapshot includes.
type RestoredPod struct {
	Name   string
	DPRank int
	Seq    uint64
	HasSeq bool
}

// restoreGate holds back the pods loaded from a snapshot until their stream
// shows the snapshot still describes the engine: the first batch after
// start continues the sequence (seq > the snapshot's) and the pod is served
// again; a first batch at or below the snapshot's seq means the engine
// restarted since, and the pod is cleared before that batch applies. Until
// then the pod is stale: listed, never scored.
type restoreGate struct {
	pending atomic.Int32
	mu      sync.RWMutex
	byID    map[kvindex.PodID]RestoredPod
}

// MarkRestored marks pods loaded from a snapshot stale until their streams
// resume (see restoreGate). Call it before events flow.
func (x *Indexer) MarkRestored(pods []RestoredPod) {
	g := &x.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byID == nil {
		g.byID = make(map[kvindex.PodID]RestoredPod, len(pods))
	}
	for _, p := range pods {
		if id, ok := x.in.LookupPod(p.Name, p.DPRank); ok {
			g.byID[id] = p
		}
	}
	g.pending.Store(int32(len(g.byID)))
}

// StalePods is how many restored pods still wait for their stream.
func (x *Indexer) StalePods() int { return int(x.gate.pending.Load()) }

// stale reports whether pod waits for its stream; one atomic load once
// every restored pod has resumed.
func (g *restoreGate) stale(pod kvindex.PodID) bool {
	if g.pending.Load() == 0 {
		return false
	}
	g.mu.RLock()
	_, ok := g.byID[pod]
	g.mu.RUnlock()
	return ok
}

// resume settles a restored pod at its first batch.
func (x *Indexer) resume(ctx context.Context, b *event.Batch) {
	id, ok := x.in.LookupPod(b.Pod, b.DPRank)
	if !ok {
		return
	}
	g := &x.gate
	g.mu.Lock()
	p, ok := g.byID[id]
	if ok {
		delete(g.byID, id)
		g.pending.Store(int32(len(g.byID)))
	}
	g.mu.Unlock()
	if !ok {
		return
	}
	if !p.HasSeq || b.Seq <= p.Seq {
		// The engine restarted since the snapshot (or it cannot be told):
		// what the snapshot holds for it is not its cache any more. The
		// clear goes in front of the batch as an AllBlocksCleared so the
		// applier forgets its own per-pod state with the index entries
		// (copy counts, parity, aliases), as for any engine-side clear.
		b.Events = append([]event.Event{{Kind: event.AllBlocksCleared}}, b.Events...)
		x.m.restoreClears.Inc()
	}
}

// refs lists the pods still waiting, for pod listings.
func (g *restoreGate) refs() []PodRef {
	if g.pending.Load() == 0 {
		return nil
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make([]PodRef, 0, len(g.byID))
	for _, p := range g.byID {
		out = append(out, PodRef{Name: p.Name, DPRank: p.DPRank})
	}
	return out
}
