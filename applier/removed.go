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
func (a *Applier) snapshot(ctx context.Context, ps *podState, ev *event.Event, d *batchDelta) error {
	if err := a.idx.ClearPod(ctx, ps.id); err != nil {
		return err
	}
	ps.resetHolding()
	keys := ps.keys[:0]
	for _, eh := range ev.BlockHashes {
		keys = uncheckedKey(ps, eh, keys)
	}
	ps.keys = keys
	return a.addStored(ctx, ps, ev, keys, d)
}

func (a *Applier) removed(ctx context.Context, ps *podState, engine blockkeys.Engine, ev *event.Event, d *batchDelta) error {
	bounds, bit := ps.removeGroup(ev)
	switch {
	case ev.Remote:
		d.remote += uint64(len(ev.BlockHashes))
		return nil
	case !bounds:
		d.groupSkipped += uint64(len(ev.BlockHashes))
		return nil
	}
	if ev.HasRemainingCopies && !ps.copiesAuthority {
		// The engine counts copies itself: ours are no longer needed.
		ps.copies.release()
		ps.copiesAuthority, ps.copies = true, nil
	}
	keys := ps.keys[:0]
	for i, eh := range ev.BlockHashes {
		k := blockkeys.Key(eh)
		if ps.alias != nil {
			var ok bool
			if k, ok = ps.alias.get(eh); !ok {
				d.unresolved++
				k = blockkeys.Key(eh)
			}
			// Keep the alias: the block may still be held on another tier.
		}
		if a.keepOnRemove(ps, engine, ev, i, bit, k, d) {
			continue
		}
		keys = append(keys, k)
	}
	ps.keys = keys
	if len(keys) == 0 {
		return nil
	}
	if err := a.idx.Remove(ctx, ps.modelID, ps.id, ev.Medium, keys); err != nil {
		return err
	}
	d.removed += uint64(len(keys))
	return nil
}
