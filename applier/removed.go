package applier

import (
	"context"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// snapshot replaces what the index holds for the pod with ev.BlockHashes,
// the pod's whole state at one point (SGLang's snapshot protocol). Snapshot
// records carry SGLang hashes without token ids; the hash is the key
// (SGLang's hashing is reproduced on the request path), or, on a pod whose
// hashes mismatched ours, the key its earlier BlockStored aliased it to. The
// engine's cache being unchanged, parity conclusions and aliases are kept. The records name no medium: they are indexed on
// ev.Medium (GPU). Clear then add is not atomic for readers: a score in
// between sees the pod empty (an under-report, never a stale block).
//
// A part (ev.SnapshotPart: kvevents applies a large snapshot in turns)
// adds its records to what the earlier parts put in, without clearing: the
// pod's stream says it is incomplete until the last part is applied.
func (a *Applier) snapshot(ctx context.Context, pod *podState, ev *event.Event, d *batchDelta) error {
	if !ev.SnapshotPart {
		if err := a.idx.ClearPod(ctx, pod.id); err != nil {
			return err
		}
		pod.resetHolding()
	}
	// The snapshot replaces the pod's state: its records are held to the
	// pod's share like stored blocks (the pod was just cleared, so its
	// other ranks' entries are what is left of the share), and the records
	// beyond it are not even looked at, so a snapshot costs the apply
	// worker at most a share's worth of work. Before, one snapshot of
	// 4.19M records put them all on one pod.
	mu := a.lockShare(pod)
	defer unlockShare(mu)
	hashes := ev.BlockHashes[:a.shareAllows(pod, len(ev.BlockHashes))]
	keys := pod.keys[:0]
	for _, eh := range hashes {
		keys = uncheckedKey(pod, eh, keys)
	}
	pod.keys = keys
	return a.addStored(ctx, pod, ev, keys, false, d)
}

// removed queues the keys ev removes from the index in pod.removing; the
// caller removes them (flushRemoved) once the run of BlockRemoved events
// on one medium ends, so an eviction sweep of one-block events costs one
// index call instead of one per block.
func (a *Applier) removed(pod *podState, engine blockkeys.Engine, ev *event.Event, d *batchDelta) {
	bounds, bit := pod.removeGroup(ev)
	switch {
	case ev.Remote:
		d.remote += uint64(len(ev.BlockHashes))
		return
	case !bounds:
		d.groupSkipped += uint64(len(ev.BlockHashes))
		return
	}
	if ev.HasRemainingCopies && !pod.copiesAuthority {
		// The engine counts its GPU copies itself: ours are no longer read
		// for the GPU tier. The table goes (most of it is GPU counts); the
		// other tiers' counts start again from the next store, losing
		// precision once in the safe direction (tables.go).
		pod.copies.release()
		pod.copiesAuthority, pod.copies = true, nil
	}
	for i, eh := range ev.BlockHashes {
		k := blockkeys.Key(eh)
		if pod.alias != nil {
			var ok bool
			if k, ok = pod.alias.get(eh); !ok {
				d.unresolved++
				k = blockkeys.Key(eh)
			}
			// Keep the alias: the block may still be held on another tier.
		}
		if a.answered != nil {
			pod.answered = append(pod.answered, k)
		}
		if a.keepOnRemove(pod, engine, ev, i, bit, k, d) {
			continue
		}
		pod.removing = append(pod.removing, k)
	}
}

// flushRemoved removes the queued keys from tier.
func (a *Applier) flushRemoved(ctx context.Context, pod *podState, tier event.Tier, d *batchDelta) error {
	keys := pod.removing
	pod.removing = keys[:0]
	if len(keys) == 0 {
		return nil
	}
	if err := a.idx.Remove(ctx, pod.modelID, pod.id, tier, keys); err != nil {
		return err
	}
	d.removed += uint64(len(keys))
	return nil
}
