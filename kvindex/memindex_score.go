package kvindex

import (
	"context"
	"slices"
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
	alive   int     // alive pods
	w       TierWeights
	raw     []uint64 // packed holders of the current block
	prev    []uint64 // packed holders of the previous step
	marked  []PodID  // pods whose holders changed at this step
}

// ScorePrefix implements PrefixScorer.
func (idx *MemoryIndex) ScorePrefix(ctx context.Context, model ModelID, keys []Key, candidates []PodID, w TierWeights, res *ScoreResult) error {
	st := idx.scores.Get().(*memScore)
	defer idx.scores.Put(st)
	st.begin(idx, w, candidates)
	stop := idx.scoreWalk(ctx, model, keys, st)
	if stop < 0 {
		return ctx.Err()
	}
	for _, p := range st.touched {
		a := &st.acc[p]
		switch a.state {
		case podAlive:
			a.appendScore(res, p, stop, &st.w)
		case podDead:
			a.appendScore(res, p, a.end, &st.w)
		}
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
// A block whose holder-set signature equals the previous block's costs one
// compare. Otherwise the two sorted lists are merged and only pods with a
// holder in one list but not the other are looked at again: they may die
// (no live holder left) or change best tier. Every other alive pod simply
// continues, so along a prefix shared by many pods a block costs about one
// word compare per holder.
func (idx *MemoryIndex) scoreWalk(ctx context.Context, model ModelID, keys []Key, st *memScore) int32 {
	if ctx.Err() != nil {
		return -1
	}
	var prevSig uint64
	first := true
	st.alive = 0
	// Keys are handled in groups: first hash every key of the group and
	// load its home slot, all loads back to back so their cache misses
	// overlap, then walk the group with the slots already in cache.
	var group [prefetchGroup]struct{ h, sk uint64 }
	salt := modelSalt(model)
	step := int32(0)
	for i := range keys {
		g := i % prefetchGroup
		if g == 0 {
			for j := 0; j < prefetchGroup && i+j < len(keys); j++ {
				sk := uint64(keys[i+j]) ^ salt
				h := mix64(sk)
				group[j].h, group[j].sk = h, sk
				idx.shardOf(h).touch(h)
			}
		}
		r := group[g]
		raw, sig, found, same := idx.shardOf(r.h).read(r.h, r.sk, st.raw[:0], prevSig, !first)
		st.raw = raw
		if !found {
			return int32(i)
		}
		if same {
			continue
		}
		step++
		if first {
			for _, h := range raw {
				if idx.isLive(h) {
					st.start(holderPod(h), holderTier(h))
				}
			}
			first = false
		} else {
			st.diff(idx, int32(i), step)
		}
		if st.alive == 0 {
			return int32(i)
		}
		prevSig = sig
		st.raw, st.prev = st.prev, raw
	}
	return int32(len(keys))
}

// start records a live holder of block 0.
func (st *memScore) start(p PodID, t Tier) {
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
		a.state, a.cur = podAlive, t
		st.alive++
	case podAlive:
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
		a := &st.acc[p]
		// best live tier of p in this block: p's holders are contiguous
		lo, _ := slices.BinarySearch(cur, uint64(p)<<holderPodShift)
		best, any := a.cur, false
		for _, h := range cur[lo:] {
			if holderPod(h) != p {
				break
			}
			if !idx.isLive(h) {
				continue
			}
			if t := holderTier(h); !any || st.w[t] > st.w[best] {
				best, any = t, true
			}
		}
		switch {
		case !any:
			a.state, a.end = podDead, i
			st.alive--
		case best != a.cur:
			a.switchTier(i, best)
		}
	}
}

// mark queues alive pod p for a recount at this step (once).
func (st *memScore) mark(p PodID, step int32) {
	if int(p) >= len(st.acc) {
		return
	}
	a := &st.acc[p]
	if a.gen != st.gen || a.state != podAlive || a.mark == step {
		return
	}
	a.mark = step
	st.marked = append(st.marked, p)
}

// prefetchGroup is how many keys scoreWalk prefetches at once.
const prefetchGroup = 8
