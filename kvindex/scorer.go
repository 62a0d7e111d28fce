package kvindex

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"sync"
)

// TierWeights is what one matched block is worth on each tier.
type TierWeights [NumTiers]float64

// DefaultTierWeights: a block in GPU memory is worth a full block of prefill;
// one that must first be copied back from CPU, disk or external storage is
// worth less, by roughly how much slower that copy is.
func DefaultTierWeights() TierWeights {
	return TierWeights{TierGPU: 1.0, TierCPU: 0.8, TierDisk: 0.5, TierExternal: 0.3}
}

// PodScore is one pod's match for a key sequence.
type PodScore struct {
	Pod           PodID
	MatchedBlocks int     // length of the pod's run of consecutive blocks from block 0
	Score         float64 // sum over that run of the best tier weight of each block
	// TierBlocks counts the run's blocks by the tier that was counted for them
	// (the best-weighted one when a pod holds a block on several tiers).
	TierBlocks [NumTiers]int32
}

// ScoreResult is the answer to one Score call. Pods holds only pods with
// MatchedBlocks > 0, sorted by Score desc, then MatchedBlocks desc, then Pod.
type ScoreResult struct {
	TotalBlocks int
	Pods        []PodScore
}

// Scorer computes per-pod longest-prefix scores over an Index. It is safe for
// concurrent use; per-call state comes from a pool, so a warm Score does not
// allocate.
type Scorer struct {
	idx    Index
	mem    *MemoryIndex // non-nil: fast path that skips the Visitor interface
	w      TierWeights
	states sync.Pool // *scoreState
}

// NewScorer returns a scorer over idx with tier weights w. PodIDs are
// expected to be dense (from an Interner): per-call state has one entry per
// PodID up to the highest one seen.
func NewScorer(idx Index, w TierWeights) *Scorer {
	s := &Scorer{idx: idx, w: w}
	s.mem, _ = idx.(*MemoryIndex)
	s.states.New = func() any { return &scoreState{} }
	return s
}

// Weights returns the scorer's tier weights.
func (s *Scorer) Weights() TierWeights { return s.w }

// podAcc is one pod's running match in a Score call. gen says whether the
// entry belongs to the current call, so the array never needs clearing.
//
// Both paths look only at "steps": block 0 and every block whose holders
// differ from the previous block's. Between steps nothing changes, so runs
// are tracked lazily: tier counts are credited when a pod's best tier
// changes or its run ends, never per block.
type podAcc struct {
	gen      uint32
	last     int32 // generic path: step that last extended the pod, -1 = none
	runStart int32 // block where the current run on tier cur began
	end      int32 // fast path: block where the run ended (when state is dead)
	mark     int32 // fast path: step that last queued the pod for a recount
	state    uint8 // fast path: podIdle, podAlive or podDead
	cur      Tier
	tiers    [NumTiers]int32
}

const (
	podIdle = iota
	podAlive
	podDead
)

type scoreState struct {
	acc     []podAcc
	gen     uint32
	all     bool    // no candidate filter: pods join at block 0
	touched []PodID // pods taking part in this call
	alive   int     // generic: pods extended at the current step; fast: alive pods
	w       *TierWeights
	steps   []int32  // generic path: block where each step begins, then where the walk ended
	raw     []uint64 // fast path: packed holders of the current block
	prev    []uint64 // fast path: packed holders of the previous step
	marked  []PodID  // fast path: pods whose holders changed at this step
}

// Score fills res with each pod's longest prefix match of keys. candidates
// nil means every pod; otherwise only the listed pods are scored and the
// lookup stops as soon as none of them can extend its run. res is reused.
func (s *Scorer) Score(ctx context.Context, model ModelID, keys []Key, candidates []PodID, res *ScoreResult) error {
	res.TotalBlocks = len(keys)
	res.Pods = res.Pods[:0]
	if len(keys) == 0 || (candidates != nil && len(candidates) == 0) {
		return nil
	}
	if len(keys) > math.MaxInt32 {
		return errors.New("kvindex: too many blocks in one request")
	}
	st := s.states.Get().(*scoreState)
	defer s.states.Put(st)
	st.begin(&s.w, candidates, s.mem)
	if s.mem != nil {
		stop := s.scoreMemory(ctx, model, keys, st)
		if stop < 0 {
			return ctx.Err()
		}
		for _, p := range st.touched {
			a := &st.acc[p]
			switch a.state {
			case podAlive:
				s.appendScore(res, p, a, stop)
			case podDead:
				s.appendScore(res, p, a, a.end)
			}
		}
	} else {
		if err := s.idx.Lookup(ctx, model, keys, st); err != nil {
			return err
		}
		// the walk ended at the last visited block if that extended no
		// one, else at the next one (unvisited: no holder, or the end)
		if n := len(st.steps); n > 0 && st.alive > 0 {
			st.steps = append(st.steps, st.steps[n-1]+1)
		}
		for _, p := range st.touched {
			if a := &st.acc[p]; a.last >= 0 {
				s.appendScore(res, p, a, st.steps[a.last+1])
			}
		}
	}
	slices.SortFunc(res.Pods, comparePodScores)
	return nil
}

func (s *Scorer) appendScore(res *ScoreResult, p PodID, a *podAcc, matched int32) {
	a.tiers[a.cur] += matched - a.runStart
	ps := PodScore{Pod: p, MatchedBlocks: int(matched), TierBlocks: a.tiers}
	for t, n := range a.tiers {
		ps.Score += float64(n) * s.w[t]
	}
	res.Pods = append(res.Pods, ps)
}

func comparePodScores(a, b PodScore) int {
	if a.Score != b.Score {
		if a.Score > b.Score {
			return -1
		}
		return 1
	}
	if a.MatchedBlocks != b.MatchedBlocks {
		return b.MatchedBlocks - a.MatchedBlocks
	}
	return cmp.Compare(a.Pod, b.Pod)
}

func (st *scoreState) begin(w *TierWeights, candidates []PodID, mem *MemoryIndex) {
	st.w = w
	st.gen++
	if st.gen == 0 { // wrapped: old stamps could look current
		clear(st.acc)
		st.gen = 1
	}
	st.touched = st.touched[:0]
	st.all = candidates == nil
	for _, p := range candidates {
		if p >= MaxPods || (mem != nil && mem.epochs[p>>podPageBits].Load() == nil) {
			// never indexed, so it cannot match; skipping it also keeps a
			// stray huge id from sizing the per-pod array
			continue
		}
		a := st.slot(p)
		if a.gen == st.gen { // duplicate candidate
			continue
		}
		*a = podAcc{gen: st.gen, last: -1}
		st.touched = append(st.touched, p)
	}
	st.steps = st.steps[:0]
}

// slot returns pod p's accumulator, growing the array on first sight of a
// high PodID (a one-off allocation per state).
func (st *scoreState) slot(p PodID) *podAcc {
	if int(p) >= len(st.acc) {
		n := max(int(p)+1, 2*len(st.acc), 64)
		a := make([]podAcc, n)
		copy(a, st.acc)
		st.acc = a
	}
	return &st.acc[p]
}

// hold records that pod p holds block i, the start of step c, on tier t.
func (st *scoreState) hold(c, i int32, p PodID, t Tier) {
	var a *podAcc
	if int(p) < len(st.acc) && st.acc[p].gen == st.gen {
		a = &st.acc[p]
	} else {
		if !st.all || c != 0 {
			return // not a candidate, or its run cannot start at block 0
		}
		a = st.slot(p)
		*a = podAcc{gen: st.gen, last: -1, cur: t}
		st.touched = append(st.touched, p)
	}
	switch a.last {
	case c - 1: // alive: extend
		a.last = c
		st.alive++
		if t != a.cur {
			a.tiers[a.cur] += i - a.runStart
			a.runStart = i
			a.cur = t
		}
	case c: // same block on another tier or group: keep the best tier
		if st.w[t] > st.w[a.cur] {
			a.tiers[a.cur] += i - a.runStart
			a.runStart = i
			a.cur = t
		}
	}
}

// Visit implements Visitor for indexes other than MemoryIndex. Every block
// is a step.
func (st *scoreState) Visit(i int, _ Key, holders []Holder) bool {
	st.alive = 0
	st.steps = append(st.steps, int32(i))
	c := int32(len(st.steps) - 1)
	for _, h := range holders {
		if h.Tier < NumTiers {
			st.hold(c, int32(i), h.Pod, h.Tier)
		}
	}
	return st.alive > 0
}

// scoreMemory is Lookup+Visit fused for MemoryIndex; it returns the block
// where the walk stopped (-1 if ctx is done). It works on the packed, sorted
// holder words and checks epochs itself. A block whose holder-set signature
// equals the previous block's costs one compare. Otherwise the two sorted
// lists are merged and only pods with a holder in one list but not the
// other are looked at again: they may die (no live holder left) or change
// best tier. Every other alive pod simply continues, so along a prefix
// shared by many pods a block costs about one word compare per holder.
func (s *Scorer) scoreMemory(ctx context.Context, model ModelID, keys []Key, st *scoreState) int32 {
	if ctx.Err() != nil {
		return -1
	}
	idx := s.mem
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
func (st *scoreState) start(p PodID, t Tier) {
	var a *podAcc
	if int(p) < len(st.acc) && st.acc[p].gen == st.gen {
		a = &st.acc[p]
	} else {
		if !st.all {
			return
		}
		a = st.slot(p)
		*a = podAcc{gen: st.gen}
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
func (st *scoreState) diff(idx *MemoryIndex, i, step int32) {
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
			a.tiers[a.cur] += i - a.runStart
			a.runStart, a.cur = i, best
		}
	}
}

// mark queues alive pod p for a recount at this step (once).
func (st *scoreState) mark(p PodID, step int32) {
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

// prefetchGroup is how many keys scoreMemory prefetches at once.
const prefetchGroup = 8
