package applier

import (
	"math"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// maxGroups bounds the KV-cache groups a pod may describe; maxFullGroups
// the full-attention ones a group mask can track.
const (
	maxGroups     = 256
	maxFullGroups = 16
)

// storeGroup learns what ev says of its group and reports whether the group
// bounds a prefix match (full attention, or not described: older engines)
// and, when the pod has several full-attention groups, the group's mask bit.
func (pod *podState) storeGroup(ev *event.Event) (bounds bool, bit uint16) {
	g := ev.GroupIdx
	if g < 0 || g >= maxGroups {
		return false, 0
	}
	for len(pod.groups) <= g {
		pod.groups = append(pod.groups, event.GroupKindUnknown)
		pod.named = append(pod.named, false)
		pod.fullBit = append(pod.fullBit, 0)
	}
	kind := ev.GroupKind
	if kind == event.GroupKindUnknown && ev.SlidingWindow > 0 {
		kind = event.GroupSlidingWindow
	}
	if (kind != event.GroupKindUnknown && kind != pod.groups[g]) || !pod.named[g] {
		if kind != event.GroupKindUnknown {
			pod.groups[g] = kind
		}
		pod.named[g] = true
		pod.numberGroups()
	}
	return pod.groupBit(g)
}

// numberGroups gives every bounding group (full or undescribed) a mask bit,
// in group order. A change of the full-group set forgets the masks: they
// were taken against another set.
func (pod *podState) numberGroups() {
	n := 0
	for g, k := range pod.groups {
		pod.fullBit[g] = 0
		if (k == event.GroupFullAttention || k == event.GroupKindUnknown) && n < maxFullGroups && pod.named[g] {
			n++
			pod.fullBit[g] = uint8(n)
		}
	}
	if n != pod.nFull {
		pod.nFull, pod.masks = n, nil
	}
}

func (pod *podState) groupBit(g int) (bounds bool, bit uint16) {
	switch k := pod.groups[g]; {
	case k != event.GroupFullAttention && k != event.GroupKindUnknown:
		return false, 0
	case pod.fullBit[g] == 0:
		return false, 0 // beyond maxFullGroups
	case pod.nFull > 1:
		return true, 1 << (pod.fullBit[g] - 1)
	}
	return true, 0
}

// removeGroup is storeGroup for a removal: it learns nothing; a group never
// described is treated as bounding (the removal is applied, the safe way).
func (pod *podState) removeGroup(ev *event.Event) (bounds bool, bit uint16) {
	g := ev.GroupIdx
	if g < 0 || g >= maxGroups {
		return false, 0
	}
	if g >= len(pod.groups) || !pod.named[g] {
		return true, 0
	}
	if k := pod.groups[g]; k == event.GroupFullAttention || k == event.GroupKindUnknown {
		_, bit = pod.groupBit(g)
		return true, bit
	}
	return false, 0
}

// holdStored filters the keys of a stored event down to those that become
// indexed: a second physical copy of a block is only counted (vLLM), and
// with several full-attention groups a block waits until all hold it.
// countHeld: the copies are counted after the write instead, from the
// index's answer (see below); keys is then returned whole.
func (a *Applier) holdStored(pod *podState, engine blockkeys.Engine, ev *event.Event, bit uint16, keys []blockkeys.Key, d *batchDelta) (_ []blockkeys.Key, countHeld bool) {
	// Announcements are counted per (block, tier, group) on every tier:
	// vLLM's block pool announces a hash once per physical GPU block, and
	// its offloading connector announces a hash once per chunk that holds
	// it (chunks of requests sharing a prefix that ends inside a chunk
	// hold the shared blocks each) and removes it once per chunk evicted
	// (offloading/events.py asks consumers to reference-count). A
	// placeholder chunk event (no tokens, block_size 0) names one block,
	// the chunk's last, and counts as one announcement of it: all it
	// proves. On the GPU tier the engine's remaining_copy_counts, once
	// sent, replace our count.
	track := countsAnnouncements(pod, engine, ev.Medium)
	if track && bit == 0 && a.heldAdder != nil {
		// The index tells, as it adds them, which keys the pod held
		// already (kvindex.HeldAdder): only those are counted, so the
		// table holds the blocks stored more than once (a few) and a
		// key absent from it is one copy, the one indexed. Counting
		// every block cost a table lookup, a memory miss at scale, per
		// stored and per removed block (docs/performance.md). Several
		// full-attention groups keep full counts: a block is indexed
		// only once every group holds it, which the index cannot tell.
		// The share (trimToShare) then counts re-stored keys too: at
		// the share's edge fewer new blocks are indexed, never more.
		return keys, true
	}
	if !track && bit == 0 {
		return keys, false
	}
	all := uint16(1)<<pod.nFull - 1
	out := keys[:0]
	for _, k := range keys {
		if track {
			if pod.copies == nil {
				pod.copies = newCountTable(a.copyCap, &a.tables)
			}
			ck := entryKey(k, ev.Medium, ev.GroupIdx)
			c, held := pod.copies.get(ck)
			if c < math.MaxUint16 {
				c++
			}
			if pod.copies.put(ck, c) {
				d.tableEvictions++
			}
			if held {
				continue // another copy is indexed already
			}
		}
		if bit != 0 {
			if pod.masks == nil {
				pod.masks = newCountTable(a.maskCap, &a.tables)
			}
			mk := entryKey(k, ev.Medium, -1)
			m, _ := pod.masks.get(mk)
			m |= bit
			if pod.masks.put(mk, m) {
				d.tableEvictions++
			}
			if m != all {
				continue
			}
		}
		out = append(out, k)
	}
	return out, false
}

// countHeldCopy counts one more copy of k, which the index reported the pod
// already held on ev's tier (holdStored's countHeld): a key the table does
// not have is the one copy indexed, so it now has two.
func (a *Applier) countHeldCopy(pod *podState, k blockkeys.Key, ev *event.Event, d *batchDelta) {
	if pod.copies == nil {
		pod.copies = newCountTable(a.copyCap, &a.tables)
	}
	ck := entryKey(k, ev.Medium, ev.GroupIdx)
	c, ok := pod.copies.get(ck)
	if !ok {
		c = 1
	}
	if c < math.MaxUint16 {
		c++
	}
	if pod.copies.put(ck, c) {
		d.tableEvictions++
	}
}

// keepOnRemove reports whether removing copy i of key k leaves the block
// held: the engine says copies remain, or our count does. It also clears
// k's group bit.
func (a *Applier) keepOnRemove(pod *podState, engine blockkeys.Engine, ev *event.Event, i int, bit uint16, k blockkeys.Key, d *batchDelta) bool {
	switch {
	case ev.HasRemainingCopies:
		if i < len(ev.RemainingCopies) && ev.RemainingCopies[i] > 0 {
			d.copiesKept++
			return true
		}
	case countsAnnouncements(pod, engine, ev.Medium) && pod.copies != nil:
		ck := entryKey(k, ev.Medium, ev.GroupIdx)
		if c, held := pod.copies.get(ck); held && c > 1 {
			if c == 2 && bit == 0 && a.heldAdder != nil {
				// Counted from the index's answer (holdStored): an
				// absent key is one copy, so the table keeps only the
				// blocks held more than once.
				pod.copies.del(ck)
			} else {
				pod.copies.put(ck, c-1)
			}
			d.copiesKept++
			return true
		}
		pod.copies.del(ck)
	}
	if bit != 0 && pod.masks != nil {
		// Any full-attention group dropping the block ends the match there.
		mk := entryKey(k, ev.Medium, -1)
		if m, ok := pod.masks.get(mk); ok {
			if m &^= bit; m == 0 {
				pod.masks.del(mk)
			} else {
				pod.masks.put(mk, m)
			}
		}
	}
	return false
}

// countsAnnouncements reports whether the applier counts the pod's
// announcements of blocks on tier (see holdStored): vLLM pods, every tier,
// except the GPU tier once the engine counts its copies itself.
func countsAnnouncements(pod *podState, engine blockkeys.Engine, tier event.Tier) bool {
	return engine.Info().CountsCopies && (tier != event.TierGPU || !pod.copiesAuthority)
}
