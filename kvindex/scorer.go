package kvindex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TierWeights is what one matched block is worth on each tier.
type TierWeights [event.NumTiers]float64

// DefaultTierWeights: a block in GPU memory is worth a full block of prefill;
// one that must first be copied back from CPU, disk or external storage is
// worth less, by roughly how much slower that copy is. A shared-storage
// block a pod can load (TierShared) weighs 0.4, llm-d's proposed default
// for its shared_storage tier (llm-d-router issue #2808).
func DefaultTierWeights() TierWeights {
	return TierWeights{event.TierGPU: 1.0, event.TierCPU: 0.8, event.TierDisk: 0.5, event.TierExternal: 0.3, event.TierShared: 0.4}
}

// TierWeightOption is the range of each weight of TierWeights (kvindexd's
// --tier-weights, a list, so the row is checked by Validate rather than
// bound to a flag of its own). A weight multiplies matched blocks into a
// score: NaN or an infinity would make every comparison of scores false or
// equal, and a huge one overflows the sum to +Inf, so weights are finite and
// at most 1000 (a GPU block is 1; nothing needs a tier worth 1000 of it).
var TierWeightOption = option.Float{Name: "tier-weights", Default: 1, Min: 0, Max: 1000,
	Help: "score weight of one matched block on a tier"}

// Validate says which weight is outside TierWeightOption's range.
func (w TierWeights) Validate() error {
	for t, v := range w {
		if err := TierWeightOption.Check(v); err != nil {
			return fmt.Errorf("%s weight: %w", event.Tier(t), err)
		}
	}
	// A block a pod can only load from shared storage is never worth more
	// than one it holds itself (indexer/storage.go): shared weighs at most
	// the gpu, cpu and disk weights.
	for _, t := range []event.Tier{event.TierGPU, event.TierCPU, event.TierDisk} {
		if w[event.TierShared] > w[t] {
			return fmt.Errorf("shared weight %v exceeds the %s weight %v: a storage credit would outrank a pod's own blocks", w[event.TierShared], t, w[t])
		}
	}
	return nil
}

// PodScore is one pod's match for a key sequence.
type PodScore struct {
	Pod           PodID
	MatchedBlocks int     // length of the pod's run of consecutive blocks from block 0
	Score         float64 // sum over that run of the best tier weight of each block
	// TierBlocks counts the run's blocks by the tier that was counted for them
	// (the best-weighted one when a pod holds a block on several tiers).
	TierBlocks [event.NumTiers]int32
	// TierRuns is, per tier on its own, the run of consecutive blocks from
	// block 0 the pod holds on that tier: a block held on two tiers counts
	// in both, and a tier missing from some block stops counting there even
	// if the pod's run goes on. llm-d's precise prefix producer reports this
	// breakdown (matchedBlockCountByTier), so its consumers read it so.
	TierRuns [event.NumTiers]int32
}

// ScoreResult is the answer to one Score call. Pods holds only pods with
// MatchedBlocks > 0, sorted by Score desc, then MatchedBlocks desc, then Pod.
type ScoreResult struct {
	TotalBlocks int
	Pods        []PodScore
}

// PrefixScorer is implemented by an Index that can score a key sequence
// itself, in one pass over its own storage, instead of handing every
// block's holders to a Visitor. Scorer uses it when the index has it and
// otherwise walks Lookup; both must give the same result.
//
// ScorePrefix is called with at least one key and with candidates either
// nil (every pod) or non-empty, and with res.Pods empty. It appends one
// PodScore for each pod (among candidates) whose run of consecutive blocks
// from block 0 is not empty, in any order: Scorer sorts them.
type PrefixScorer interface {
	ScorePrefix(ctx context.Context, model ModelID, keys []blockkeys.Key, candidates []PodID, w TierWeights, res *ScoreResult) error
}

// Scorer computes per-pod longest-prefix scores over an Index. It is safe for
// concurrent use; per-call state comes from a pool, so a warm Score does not
// allocate.
type Scorer struct {
	idx    Index
	prefix PrefixScorer // non-nil when idx scores prefixes itself
	w      TierWeights
	states sync.Pool // *scoreState
}

// NewScorer returns a scorer over idx with tier weights w. prefix is the
// index's own prefix scoring (PrefixScorer), or nil to walk Lookup; it is
// passed explicitly, not discovered on idx, so a wrapper around the index
// cannot switch it off unseen. PodIDs are expected to be dense (from an
// Interner): per-call state has one entry per PodID up to the highest one
// seen.
func NewScorer(idx Index, prefix PrefixScorer, w TierWeights) *Scorer {
	s := &Scorer{idx: idx, prefix: prefix, w: w}
	s.states.New = func() any { return &scoreState{} }
	return s
}

// Weights returns the scorer's tier weights.
func (s *Scorer) Weights() TierWeights { return s.w }

// podRun is the part of a pod's running match both scoring paths keep.
// Tier counts are credited lazily, when the pod's best tier changes or its
// run ends, never per block.
//
// The per-tier runs (PodScore.TierRuns) are kept the same way: runMask is
// the tiers the pod held on every block so far, and a tier's run is
// written when it leaves the mask (narrow) or the pod's run ends. The
// generic path sees a block's holders one at a time, so it collects the
// block's tiers in stepMask and narrows by them only when the next block
// (or the end) shows the block is complete; the fused path knows a
// block's tiers at once and keeps stepMask at allTiers.
type podRun struct {
	runStart  int32 // block where the current run on tier cur began
	stepStart int32 // block where the tiers in stepMask were seen
	cur       event.Tier
	runMask   uint8 // tiers held on every block before stepStart
	stepMask  uint8 // tiers held on block stepStart (generic path)
	tiers     [event.NumTiers]int32
	runs      [event.NumTiers]int32
}

// allTiers is the tier mask with every tier.
const allTiers = uint8(1)<<event.NumTiers - 1

// narrow ends, at block i, the runs of the tiers in runMask but not in m.
func (r *podRun) narrow(i int32, m uint8) {
	for gone := r.runMask &^ m; gone != 0; gone &= gone - 1 {
		r.runs[bits.TrailingZeros8(gone)] = i
	}
	r.runMask &= m
}

// switchTier credits the blocks before i to the current tier and continues
// the run on tier t from block i.
func (r *podRun) switchTier(i int32, t event.Tier) {
	r.tiers[r.cur] += i - r.runStart
	r.runStart, r.cur = i, t
}

// appendScore ends pod p's run at block matched (exclusive) and appends its
// score to res. It fills the new element in place, field by field: building
// a PodScore and appending it costs several times more (wide loads of
// freshly written narrow fields stall store forwarding).
func (r *podRun) appendScore(res *ScoreResult, p PodID, matched int32, w *TierWeights) {
	r.tiers[r.cur] += matched - r.runStart
	r.narrow(r.stepStart, r.stepMask)
	r.narrow(matched, 0)
	res.Pods = append(res.Pods, PodScore{})
	ps := &res.Pods[len(res.Pods)-1]
	ps.Pod, ps.MatchedBlocks = p, int(matched)
	var score float64
	for t := range r.tiers {
		n := r.tiers[t]
		ps.TierBlocks[t] = n
		ps.TierRuns[t] = r.runs[t]
		score += float64(n) * w[t]
	}
	ps.Score = score
}

// podAcc is one pod's running match in a generic Score call. gen says
// whether the entry belongs to the current call, so the array never needs
// clearing.
type podAcc struct {
	gen  uint32
	last int32 // step that last extended the pod, -1 = none
	podRun
}

// scoreState is the per-call state of the generic path. Every visited block
// is a step; steps[c] is where step c begins, then where the walk ended.
type scoreState struct {
	acc     []podAcc
	gen     uint32
	all     bool    // no candidate filter: pods join at block 0
	touched []PodID // pods taking part in this call
	alive   int     // pods extended at the current step
	w       *TierWeights
	steps   []int32
}

// Score fills res with each pod's longest prefix match of keys. candidates
// nil means every pod; otherwise only the listed pods are scored and the
// lookup stops as soon as none of them can extend its run. res is reused.
func (s *Scorer) Score(ctx context.Context, model ModelID, keys []blockkeys.Key, candidates []PodID, res *ScoreResult) error {
	res.TotalBlocks = len(keys)
	res.Pods = res.Pods[:0]
	if len(keys) == 0 || (candidates != nil && len(candidates) == 0) {
		return nil
	}
	if len(keys) > math.MaxInt32 {
		return errors.New("kvindex: too many blocks in one request")
	}
	var err error
	if s.prefix != nil {
		err = s.prefix.ScorePrefix(ctx, model, keys, candidates, s.w, res)
	} else {
		err = s.scoreVisiting(ctx, model, keys, candidates, res)
	}
	if err != nil {
		res.Pods = res.Pods[:0]
		return err
	}
	// a PrefixScorer may deliver them sorted already (see MemoryIndex)
	if !slices.IsSortedFunc(res.Pods, ComparePodScores) {
		slices.SortFunc(res.Pods, ComparePodScores)
	}
	return nil
}

// scoreVisiting scores through Lookup and the Visitor interface.
func (s *Scorer) scoreVisiting(ctx context.Context, model ModelID, keys []blockkeys.Key, candidates []PodID, res *ScoreResult) error {
	st := s.states.Get().(*scoreState)
	defer s.states.Put(st)
	st.begin(&s.w, candidates)
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
			a.appendScore(res, p, st.steps[a.last+1], &s.w)
		}
	}
	return nil
}

// ComparePodScores is ScoreResult's order: Score desc, then MatchedBlocks
// desc, then Pod.
func ComparePodScores(a, b PodScore) int {
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

func (st *scoreState) begin(w *TierWeights, candidates []PodID) {
	st.w = w
	st.gen++
	if st.gen == 0 { // wrapped: old stamps could look current
		clear(st.acc)
		st.gen = 1
	}
	st.touched = st.touched[:0]
	st.all = candidates == nil
	for _, p := range candidates {
		if p >= MaxPods {
			// cannot be indexed, so it cannot match; skipping it also
			// keeps a stray huge id from sizing the per-pod array
			continue
		}
		a := growAcc(&st.acc, p)
		if a.gen == st.gen { // duplicate candidate
			continue
		}
		*a = podAcc{gen: st.gen, last: -1, podRun: podRun{runMask: allTiers}}
		st.touched = append(st.touched, p)
	}
	st.steps = st.steps[:0]
}

// growAcc returns pod p's entry in a per-pod array, growing the array on
// first sight of a high PodID (a one-off allocation per pooled state).
func growAcc[A any](acc *[]A, p PodID) *A {
	if int(p) >= len(*acc) {
		n := max(int(p)+1, 2*len(*acc), 64)
		a := make([]A, n)
		copy(a, *acc)
		*acc = a
	}
	return &(*acc)[p]
}

// hold records that pod p holds block i, the start of step c, on tier t.
func (st *scoreState) hold(c, i int32, p PodID, t event.Tier) {
	var a *podAcc
	if int(p) < len(st.acc) && st.acc[p].gen == st.gen {
		a = &st.acc[p]
	} else {
		if !st.all || c != 0 {
			return // not a candidate, or its run cannot start at block 0
		}
		a = growAcc(&st.acc, p)
		*a = podAcc{gen: st.gen, last: -1, podRun: podRun{cur: t, runMask: allTiers}}
		st.touched = append(st.touched, p)
	}
	switch a.last {
	case c - 1: // alive: extend
		if c > 0 {
			// the previous step's holders are all seen: its tiers are final
			a.narrow(a.stepStart, a.stepMask)
		}
		a.stepStart, a.stepMask = i, 1<<t
		a.last = c
		st.alive++
		if t != a.cur {
			a.switchTier(i, t)
		}
	case c: // same block on another tier or group: keep the best tier
		a.stepMask |= 1 << t
		if st.w[t] > st.w[a.cur] {
			a.switchTier(i, t)
		}
	}
}

// Visit implements Visitor for the generic path. Every block is a step.
func (st *scoreState) Visit(i int, _ blockkeys.Key, holders []Holder) bool {
	st.alive = 0
	st.steps = append(st.steps, int32(i))
	c := int32(len(st.steps) - 1)
	for _, h := range holders {
		if h.Tier < event.NumTiers {
			st.hold(c, int32(i), h.Pod, h.Tier)
		}
	}
	return st.alive > 0
}
