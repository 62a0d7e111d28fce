package indexer

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/kvindex/kvindex/kvindex"
)

// Score answers q into r: input -> block keys -> index lookup over trusted
// candidates -> one entry per pod name. A non-nil error is an *Error and r
// is then empty.
func (x *Indexer) Score(ctx context.Context, q *Query, r *Result) error {
	r.clear()
	if err := x.score(ctx, q, r); err != nil {
		r.clear()
		return err
	}
	return nil
}

func (x *Indexer) score(ctx context.Context, q *Query, r *Result) *Error {
	if err := q.validate(); err != nil {
		return err
	}
	// A model nobody has published for is known to the interner only once an
	// event arrived; scoring it is legal (nobody holds anything) but the name
	// must at least be given unless events also came without one.
	modelID, modelKnown := x.in.LookupModel(q.Model)
	if q.Model == "" && !modelKnown {
		return errorf(InvalidArgument, "model is required")
	}
	hasher := x.hashers.For(q.Model)
	r.BlockSize = hasher.Config().BlockSize

	switch q.Kind {
	case InputTokens:
		x.tokenKeys(r, hasher, q.TokenIDs, q)
	case InputHashes:
		for _, h := range q.BlockHashes {
			r.keys = append(r.keys, kvindex.Key(h))
		}
	case InputPrompt:
		if x.tok == nil {
			return errorf(FailedPrecondition, "prompt scoring is not configured (no tokenizers: see --tokenizers-dir, --hf-cache-dir, tokenizer model map)")
		}
		tokens, err := x.tok.TokenizePrompt(ctx, q.Model, q.Prompt)
		if err != nil {
			if ctx.Err() != nil {
				return ctxError(ctx.Err())
			}
			return errorf(FailedPrecondition, "tokenize prompt for model %q: %v", q.Model, err)
		}
		x.tokenKeys(r, hasher, tokens, q)
	}
	r.TotalBlocks = len(r.keys)

	var cands []kvindex.PodID
	if len(q.Pods) > 0 {
		r.cands = r.cands[:0]
		for _, name := range q.Pods {
			r.cands = append(r.cands, x.in.PodsNamed(name)...)
		}
		cands = r.cands
	}
	// Nothing can match: unknown model, no full block, or a pod filter that
	// names no known pod. Answer empty without touching the index, except
	// that an index that is down must still be reported as down.
	if !modelKnown || len(r.keys) == 0 || (len(q.Pods) > 0 && len(cands) == 0) {
		if err := x.Healthy(ctx); err != nil {
			return errorf(Unavailable, "index unavailable: %v", err)
		}
		return nil
	}

	t0 := time.Now()
	err := x.scorer.Score(ctx, modelID, r.keys, cands, &r.res)
	x.m.lookup.Observe(time.Since(t0).Seconds())
	if err != nil {
		if ctx.Err() != nil {
			return ctxError(ctx.Err())
		}
		return errorf(Unavailable, "index lookup failed: %v", err)
	}
	r.aggregate(x.in, x.trusted)
	return nil
}

// tokenKeys hashes the full blocks of tokens into r.keys, reusing the keys
// of blocks an earlier request already hashed.
func (x *Indexer) tokenKeys(r *Result, h *kvindex.Hasher, tokens []uint32, q *Query) {
	x.m.tokens.Observe(float64(len(tokens)))
	r.keys = x.keys.keys(h, r.keys[:0], tokens, kvindex.RequestExtras{LoraName: q.LoraName, CacheSalt: q.CacheSalt})
}

// aggregate folds the scorer's per-(pod, rank) results into one entry per
// pod name, leaving out pods trusted rejects: the best rank decides the
// pod's match, every matching rank is listed.
func (r *Result) aggregate(in *kvindex.Interner, trusted func(kvindex.PodID) bool) {
	if r.byName == nil {
		r.byName = make(map[string]int)
	}
	blockSize := int64(r.BlockSize)
	r.entries = r.entries[:0]
	for _, ps := range r.res.Pods {
		if !trusted(ps.Pod) {
			continue // its entries may predate a lost removal
		}
		name, rank := in.PodName(ps.Pod)
		i, ok := r.byName[name]
		if !ok {
			i = len(r.Pods)
			r.byName[name] = i
			r.Pods = append(r.Pods, PodResult{Pod: name})
		}
		e := rankEntry{pod: i, RankScore: RankScore{DPRank: rank, MatchedBlocks: ps.MatchedBlocks, Score: ps.Score}}
		copy(e.Tiers[:], ps.TierBlocks[:])
		r.entries = append(r.entries, e)
	}
	slices.SortFunc(r.entries, func(a, b rankEntry) int {
		if c := cmp.Compare(a.pod, b.pod); c != 0 {
			return c
		}
		return compareRank(&a.RankScore, &b.RankScore)
	})
	for _, e := range r.entries {
		r.ranks = append(r.ranks, e.RankScore)
	}
	// Sub-slices are taken only after r.ranks stopped growing.
	for start := 0; start < len(r.entries); {
		end := start + 1
		for end < len(r.entries) && r.entries[end].pod == r.entries[start].pod {
			end++
		}
		p := &r.Pods[r.entries[start].pod]
		p.Ranks = r.ranks[start:end:end]
		best := p.Ranks[0]
		p.MatchedBlocks = best.MatchedBlocks
		p.MatchedTokens = int64(best.MatchedBlocks) * blockSize
		p.Score = best.Score
		p.Tiers = best.Tiers
		start = end
	}
	slices.SortFunc(r.Pods, func(a, b PodResult) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		if c := cmp.Compare(b.MatchedBlocks, a.MatchedBlocks); c != 0 {
			return c
		}
		return cmp.Compare(a.Pod, b.Pod)
	})
}

// compareRank orders ranks best first: score, then blocks, then lower rank.
func compareRank(a, b *RankScore) int {
	if c := cmp.Compare(b.Score, a.Score); c != 0 {
		return c
	}
	if c := cmp.Compare(b.MatchedBlocks, a.MatchedBlocks); c != 0 {
		return c
	}
	return cmp.Compare(a.DPRank, b.DPRank)
}

func ctxError(err error) *Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errorf(DeadlineExceeded, "deadline exceeded")
	}
	return errorf(Canceled, "request canceled")
}
