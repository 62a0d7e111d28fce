package indexer

import (
	"cmp"
	"context"
	"slices"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex"
)

// PodRef names one engine: a pod and its data-parallel rank.
type PodRef struct {
	Name   string
	DPRank int
}

// PodStatus is one (pod, rank) in a listing: what the applier applied for it
// and how many blocks the index holds for it now.
type PodStatus struct {
	// Stats is the applier's view; for a pod only named by the caller
	// (Applied false) just Pod and DPRank are set.
	Stats   applier.PodStats
	Applied bool
	// Blocks the index holds for the pod; -1 when the index cannot say now
	// (a listing still answers while the backend is down).
	Blocks int64
	// Stale: loaded from a snapshot, not served until its stream resumes.
	// Untrusted: a write of the pod's failed and it is not served until
	// its clear went through. Both are the subscriber's answer
	// (kvevents.StreamState.Held), false without one.
	Stale, Untrusted bool
}

// Pods lists every (pod, rank) the applier has seen plus the also refs
// (pods a subscriber knows that sent nothing yet), sorted by name and rank.
// Block counts come in one batched read when the backend supports it
// (kvindex.PodBlocksBatcher), else one read per pod.
func (ix *Indexer) Pods(ctx context.Context, also []PodRef) []PodStatus {
	stats := ix.applier.PodStats()
	out := make([]PodStatus, 0, len(stats)+len(also))
	seen := make(map[PodRef]struct{}, len(stats)+len(also))
	for _, st := range stats {
		seen[PodRef{st.Pod, st.DPRank}] = struct{}{}
		out = append(out, PodStatus{Stats: st, Applied: true})
	}
	for _, ref := range also {
		if _, ok := seen[ref]; ok {
			continue
		}
		seen[ref] = struct{}{}
		out = append(out, PodStatus{Stats: applier.PodStats{Pod: ref.Name, DPRank: ref.DPRank}})
	}
	slices.SortFunc(out, func(a, b PodStatus) int {
		if c := cmp.Compare(a.Stats.Pod, b.Stats.Pod); c != 0 {
			return c
		}
		return cmp.Compare(a.Stats.DPRank, b.Stats.DPRank)
	})
	ix.fillBlocks(ctx, out)
	if ix.sub != nil && !ix.sub.AllServable() {
		refs := make([]kvevents.StreamRef, len(out))
		for i := range out {
			refs[i] = kvevents.StreamRef{Pod: out[i].Stats.Pod, DPRank: out[i].Stats.DPRank}
		}
		states := make([]kvevents.StreamState, len(out))
		ix.sub.StreamStates(refs, states)
		for i := range out {
			out[i].Stale, out[i].Untrusted = states[i].Held == "restored", states[i].Held == "index_error"
		}
	}
	return out
}

// fillBlocks sets Blocks of every listed pod: 0 for a name the interner has
// never seen (nothing can be indexed for it), -1 when the read fails.
func (ix *Indexer) fillBlocks(ctx context.Context, pods []PodStatus) {
	ids := make([]kvindex.PodID, 0, len(pods))
	at := make([]int, 0, len(pods))
	for i := range pods {
		id, ok := ix.in.LookupPod(pods[i].Stats.Pod, pods[i].Stats.DPRank)
		if !ok {
			continue
		}
		ids = append(ids, id)
		at = append(at, i)
	}
	if b := ix.backend.Batch; b != nil {
		n := make([]int64, len(ids))
		err := b.PodBlocksBatch(ctx, ids, n)
		for j, i := range at {
			if err != nil {
				pods[i].Blocks = -1
			} else {
				pods[i].Blocks = n[j]
			}
		}
		return
	}
	for j, i := range at {
		n, err := ix.idx.PodBlocks(ctx, ids[j])
		if err != nil {
			n = -1
		}
		pods[i].Blocks = n
	}
}
