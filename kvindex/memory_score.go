package kvindex

import (
	"context"
	"slices"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Fused scoring: Lookup and the scorer's Visitor in one pass over the
// shards, working on the packed, sorted holder words and checking epochs
// itself.

var _ PrefixScorer = (*MemoryIndex)(nil)

// memAcc is one pod's running match in a fused scoring call. gen says
// whether the entry belongs to the current call, so the array never needs
// clearing.
//
// Only "steps" are looked at: block 0 and every block whose holders differ
// from the previous block's. Between steps nothing changes.
type memAcc struct {
	gen   uint32
	end   int32 // block where the run ended (when state is podDead)
	mark  int32 // step that last queued the pod for a recount
	state uint8 // podIdle, podAlive or podDead
	podRun
}

const (
	podIdle = iota
	podAlive
	podDead
)

// memScore is the per-call state of ScorePrefix.
type memScore struct {
	acc     []memAcc
	gen     uint32
	all     bool    // no candidate filter: pods join at block 0
	touched []PodID // pods taking part in this call
	dead    []PodID // pods whose run ended, in the order they died
	alive   int     // alive pods
	w       TierWeights
	raw     []uint64 // packed holders of the current block
	prev    []uint64 // packed holders of the previous step
	marked  []PodID  // pods whose holders changed at this step
}

// ScorePrefix implements PrefixScorer.
func (idx *MemoryIndex) ScorePrefix(ctx context.Context, model ModelID, keys []blockkeys.Key, candidates []PodID, w TierWeights, res *ScoreResult) error {
	st := idx.scores.Get().(*memScore)
	defer idx.scores.Put(st)
	st.begin(idx, w, candidates)
	stop := idx.scoreWalk(ctx, model, keys, st)
	if stop < 0 {
		return ctx.Err()
	}
	// Longest runs first: pods still alive, then the dead ones latest
	// death first, pods that died together in the order they died (by
	// PodID: diffs walk holders in pod order). With one tier that is
	// already the Scorer's order, which then only checks it.
	for _, p := range st.touched {
		if a := &st.acc[p]; a.state == podAlive {
			a.appendScore(res, p, stop, &st.w)
		}
	}
	for hi := len(st.dead); hi > 0; {
		end := st.acc[st.dead[hi-1]].end
		lo := hi - 1
		for lo > 0 && st.acc[st.dead[lo-1]].end == end {
			lo--
		}
		for _, p := range st.dead[lo:hi] {
			st.acc[p].appendScore(res, p, end, &st.w)
		}
		hi = lo
	}
	return nil
}

func (st *memScore) begin(idx *MemoryIndex, w TierWeights, candidates []PodID) {
	st.w = w
	st.gen++
	if st.gen == 0 { // wrapped: old stamps could look current
		clear(st.acc)
		st.gen = 1
	}
	st.touched = st.touched[:0]
	st.dead = st.dead[:0]
	st.all = candidates == nil
	for _, p := range candidates {
		if p >= MaxPods || idx.epochs[p>>podPageBits].Load() == nil {
			// never indexed, so it cannot match; skipping it also keeps a
			// stray huge id from sizing the per-pod array
			continue
		}
		a := growAcc(&st.acc, p)
		if a.gen == st.gen { // duplicate candidate
			continue
		}
		*a = memAcc{gen: st.gen}
		st.touched = append(st.touched, p)
	}
}

// scoreWalk returns the block where the walk stopped (-1 if ctx is done).
//
// Keys go in groups of prefetchGroup. Each key's header (value word and
// holder-set signature, see shard.head) is read in two halves: first the
// slots of the whole group, then the chunk signatures of the whole group,
// so that the cache misses of each half overlap instead of following one
// another key by key. Then the group is walked. A block whose signature
// equals the previous
// step's costs one compare. Otherwise it is a step, handled by the cheapest
// exact rule that applies:
//
//   - one holder more or less (the common case along a shared prefix, where
//     pods' runs end one at a time): with both blocks in chunks, the
//     difference of the two signatures is holderSig of that one holder,
//     which unmix64 recovers. It is accepted only if the counts differ by
//     one and it is in the previous list (a removal) or in the new chunk
//     (an addition); then the new set equals the old one with it removed
//     or added, unless two different sets of equal size share a
//     signature, the same 64-bit collision that skipping equal signatures
//     already rules out. The holder is patched into the previous list and
//     only its pod is recounted, without copying the new chunk.
//   - otherwise the block's holders are copied and merged with the previous
//     list (after trimming their common head and tail), and only pods with
//     a holder in one list but not the other are recounted.
//
// A recount looks at one pod's holders (contiguous, the lists are sorted):
// the pod dies if none is live, or changes best tier. Every other alive
// pod simply continues.
func (idx *MemoryIndex) scoreWalk(ctx context.Context, model ModelID, keys []blockkeys.Key, st *memScore) int32 {
	if ctx.Err() != nil {
		return -1
	}
	st.alive = 0
	st.prev = st.prev[:0]
	var prevV, prevSig uint64 // value word and signature of the last step
	var group [prefetchGroup]keyHead
	salt := modelSalt(model)
	shards, shift := idx.shards, 64-idx.shardBits // shardOf, hoisted
	step := int32(0)
	for base := 0; base < len(keys); base += prefetchGroup {
		n := min(prefetchGroup, len(keys)-base)
		for j := 0; j < n; j++ {
			g := &group[j]
			g.sk = uint64(keys[base+j]) ^ salt
			g.h = mix64(g.sk)
			g.sh = &shards[g.h>>shift&uint64(len(shards)-1)]
			g.s1, g.v = g.sh.headStart(g.h, g.sk)
		}
		for j := 0; j < n; j++ {
			g := &group[j]
			var ok bool
			if g.sig, ok = g.sh.headFinish(g.s1, g.v); !ok {
				g.v, g.sig = g.sh.head(g.h, g.sk)
			}
		}
		for j := 0; j < n; j++ {
			g := &group[j]
			i := int32(base + j)
			if g.v == 0 {
				return i
			}
			if step > 0 && g.sig == prevSig {
				continue
			}
			step++
			if step == 1 {
				st.prev, prevV, prevSig = g.sh.read(g.h, g.sk, st.prev[:0])
				if prevV == 0 {
					return i // removed since its header was read
				}
				for _, h := range st.prev {
					if idx.isLive(h) {
						st.start(holderPod(h), holderTier(h))
					}
				}
			} else if !st.patch(idx, i, g, prevV, prevSig) {
				var cur []uint64
				cur, prevV, prevSig = g.sh.read(g.h, g.sk, st.raw[:0])
				if prevV == 0 {
					return i
				}
				st.raw = cur
				st.diff(idx, i, step)
				st.raw, st.prev = st.prev, cur
			} else {
				prevV, prevSig = g.v, g.sig
			}
			if st.alive == 0 {
				return i
			}
		}
	}
	return int32(len(keys))
}

// keyHead is one key of scoreWalk's group: where it lives and its header.
type keyHead struct {
	sh     *shard
	h, sk  uint64
	s1     uint64 // shard sequence number when v was read
	v, sig uint64 // see shard.head
}

// patch applies the one-holder rule of scoreWalk to block i, whose key is
// g, given the previous step's value word and signature. It reports whether
// the rule applied; then st.prev is block i's holder list.
func (st *memScore) patch(idx *MemoryIndex, i int32, g *keyHead, prevV, prevSig uint64) bool {
	if prevV&tagMask != tagChunk || g.v&tagMask != tagChunk {
		return false
	}
	// y is holderSig's input for the holder that differs: a holder word with
	// bit 63 set. Whatever the two sets, the one-holder set derived this way
	// matches the signatures by construction; what makes it the real
	// difference is that x is found where it must be: in the previous list
	// for a removal (a derived x lands there by chance only through a
	// signature collision), in the new chunk for an addition.
	var y uint64
	removal := valCount(g.v) < len(st.prev)
	switch valCount(g.v) - len(st.prev) {
	case -1:
		y = unmix64(prevSig - g.sig)
	case 1:
		y = unmix64(g.sig - prevSig)
	default:
		return false
	}
	if y>>61 != 4 {
		return false
	}
	x := y &^ (1 << 63)
	j, held := slices.BinarySearch(st.prev, x)
	if held != removal || (!removal && !g.sh.chunkHas(g.h, g.sk, g.v, g.sig, x)) {
		return false
	}
	if removal {
		st.prev = slices.Delete(st.prev, j, j+1)
	} else {
		st.prev = slices.Insert(st.prev, j, x)
	}
	if p := holderPod(x); st.isAlive(p) {
		// p's holders are contiguous and x's place j is among them
		for j > 0 && holderPod(st.prev[j-1]) == p {
			j--
		}
		st.recount(idx, p, i, st.prev[j:])
	}
	return true
}

// start records a live holder of block 0.
func (st *memScore) start(p PodID, t event.Tier) {
	var a *memAcc
	if int(p) < len(st.acc) && st.acc[p].gen == st.gen {
		a = &st.acc[p]
	} else {
		if !st.all {
			return
		}
		a = growAcc(&st.acc, p)
		*a = memAcc{gen: st.gen}
		st.touched = append(st.touched, p)
	}
	switch a.state {
	case podIdle:
		// block 0's tiers start the per-tier runs; later blocks narrow
		// them in recount, so no step is left pending (stepMask)
		a.state, a.cur = podAlive, t
		a.runMask, a.stepMask = 1<<t, allTiers
		st.alive++
	case podAlive:
		a.runMask |= 1 << t
		if st.w[t] > st.w[a.cur] {
			a.cur = t
		}
	}
}

// diff compares block i's holders (st.raw) with the previous step's
// (st.prev), both sorted, and recounts the alive pods whose holders changed.
func (st *memScore) diff(idx *MemoryIndex, i, step int32) {
	st.marked = st.marked[:0]
	prev, cur := st.prev, st.raw
	// only the middle can differ: skip the common head and tail
	n := min(len(prev), len(cur))
	lo := 0
	for lo < n && prev[lo] == cur[lo] {
		lo++
	}
	hp, hc := len(prev), len(cur)
	for hp > lo && hc > lo && prev[hp-1] == cur[hc-1] {
		hp--
		hc--
	}
	prev, cur = prev[lo:hp], cur[lo:hc]
	x, y := 0, 0
	for x < len(prev) && y < len(cur) {
		a, b := prev[x], cur[y]
		switch {
		case a == b:
			x++
			y++
		case a < b:
			st.mark(holderPod(a), step)
			x++
		default:
			st.mark(holderPod(b), step)
			y++
		}
	}
	for ; x < len(prev); x++ {
		st.mark(holderPod(prev[x]), step)
	}
	for ; y < len(cur); y++ {
		st.mark(holderPod(cur[y]), step)
	}
	for _, p := range st.marked {
		lo, _ := slices.BinarySearch(st.raw, uint64(p)<<holderPodShift)
		st.recount(idx, p, i, st.raw[lo:])
	}
}

// recount re-derives alive pod p's state at block i from its holders at
// the start of cur, a tail of block i's sorted holder list that begins
// with p's first holder, if any.
func (st *memScore) recount(idx *MemoryIndex, p PodID, i int32, cur []uint64) {
	a := &st.acc[p]
	best, any := a.cur, false
	var held uint8 // tiers p holds block i on
	for _, h := range cur {
		if holderPod(h) != p {
			break
		}
		if !idx.isLive(h) {
			continue
		}
		t := holderTier(h)
		held |= 1 << t
		if !any || st.w[t] > st.w[best] {
			best, any = t, true
		}
	}
	if !any {
		a.state, a.end = podDead, i
		st.dead = append(st.dead, p)
		st.alive--
		return
	}
	a.narrow(i, held)
	if best != a.cur {
		a.switchTier(i, best)
	}
}

// isAlive reports whether p takes part in this call and its run goes on.
func (st *memScore) isAlive(p PodID) bool {
	return int(p) < len(st.acc) && st.acc[p].gen == st.gen && st.acc[p].state == podAlive
}

// mark queues alive pod p for a recount at this step (once).
func (st *memScore) mark(p PodID, step int32) {
	if !st.isAlive(p) {
		return
	}
	a := &st.acc[p]
	if a.mark == step {
		return
	}
	a.mark = step
	st.marked = append(st.marked, p)
}

// prefetchGroup is how many keys scoreWalk reads ahead.
const prefetchGroup = 8
