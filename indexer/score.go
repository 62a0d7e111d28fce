package indexer

import (
	"cmp"
	"context"
	"errors"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/tracing"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// Score answers q into r: input -> block keys -> index lookup over trusted
// candidates -> one entry per pod name. A non-nil error is an *Error and r
// is then empty.
func (ix *Indexer) Score(ctx context.Context, q *Query, r *Result) error {
	r.clear()
	if err := ix.score(ctx, q, r); err != nil {
		r.clear()
		return err
	}
	ix.fillStreams(r)
	return nil
}

func (ix *Indexer) score(ctx context.Context, q *Query, r *Result) *Error {
	if err := q.validate(); err != nil {
		return err
	}
	clk := ix.clock(OpScore)
	in, err := ix.requestKeys(ctx, q, &r.keys, &r.ek, &clk)
	if err != nil {
		return err
	}
	r.BlockSize = in.blockSize
	r.TotalBlocks = len(r.keys)
	r.UnscoredReason = in.unscored
	if ix.sub != nil {
		r.IndexRebuilding = ix.sub.Rebuilding()
	}
	lctx, span := ix.tr.StartChild(ctx, tracing.SpanLookup)
	err = ix.scoreLookup(lctx, q, r, in)
	if span.IsRecording() {
		best := 0
		if len(r.Pods) > 0 {
			best = r.Pods[0].MatchedBlocks
		}
		span.SetAttributes(tracing.Blocks.Int(len(r.keys)), tracing.PodsMatched.Int(len(r.Pods)), tracing.BestBlocks.Int(best))
	}
	endStage(span, err)
	clk.lap(StageLookup)
	return err
}

// scoreLookup matches r's keys against the index into r's pods.
func (ix *Indexer) scoreLookup(ctx context.Context, q *Query, r *Result, in requestInfo) *Error {
	modelID, modelKnown := in.model, in.modelKnown
	if !modelKnown && len(r.keys) > 0 && ix.backend.Names != nil {
		var err *Error
		if modelID, modelKnown, err = ix.sharedModel(ctx, q.Model, r.keys[0]); err != nil {
			return err
		}
	}

	var cands []kvindex.PodID
	r.nameFilter = nil
	if len(q.Pods) > 0 {
		r.cands = r.cands[:0]
		unknown := false
		for _, name := range q.Pods {
			n := len(r.cands)
			r.cands = ix.in.AppendPodsNamed(r.cands, name)
			unknown = unknown || len(r.cands) == n
		}
		cands = r.cands
		if unknown && ix.backend.Names != nil {
			// Another daemon may have written a pod this one never met:
			// score every holder (the backend interns what it reads) and
			// keep the named pods by name.
			cands, r.nameFilter = nil, q.Pods
		}
	}
	// Nothing can match: unknown model, no full block, or a pod filter that
	// names no known pod. Answer empty without touching the index, except
	// that an index that is down must still be reported as down.
	if !modelKnown || len(r.keys) == 0 || (len(q.Pods) > 0 && len(cands) == 0 && r.nameFilter == nil) {
		if err := ix.Healthy(ctx); err != nil {
			return errorf(Unavailable, "index unavailable: %v", err)
		}
		return nil
	}

	if err := ix.lookupAll(ctx, modelID, r.keys, &r.ek, cands, &r.res); err != nil {
		return err
	}
	r.aggregate(ix.in, ix.trusted, &ix.podOrder)
	if q.SessionID != "" {
		ix.preferSession(q.SessionID, r)
	}
	if ix.pred != nil {
		ix.pred.sample(modelID, r)
	}
	return nil
}

// lookup runs the scorer over the index and times it.
func (ix *Indexer) lookup(ctx context.Context, model kvindex.ModelID, keys []blockkeys.Key, cands []kvindex.PodID, res *kvindex.ScoreResult) *Error {
	t0 := time.Now()
	err := ix.scorer.Score(ctx, model, keys, cands, res)
	ix.m.lookup.Observe(time.Since(t0).Seconds())
	if err != nil {
		if ctx.Err() != nil {
			return ctxError(ctx.Err())
		}
		return errorf(Unavailable, "index lookup failed: %v", err)
	}
	return nil
}

// lookupAll scores the primary keys and every other engine's (engines.go)
// into res, storage sources credited to their readers (storage.go).
func (ix *Indexer) lookupAll(ctx context.Context, model kvindex.ModelID, keys []blockkeys.Key, ek *engineKeys,
	cands []kvindex.PodID, res *kvindex.ScoreResult) *Error {
	ix.storageIDs(&ek.st)
	all := withStorage(cands, &ek.st)
	if err := ix.lookup(ctx, model, keys, all, res); err != nil {
		return err
	}
	if err := ix.scoreEngines(ek, func(keys []blockkeys.Key, r *kvindex.ScoreResult) *Error {
		return ix.lookup(ctx, model, keys, all, r)
	}, res); err != nil {
		return err
	}
	ix.creditStorage(model, cands, &ek.st, res)
	return nil
}

// requestInfo is what requestKeys learned about a validated query.
type requestInfo struct {
	model      kvindex.ModelID
	modelKnown bool // some engine published for the model
	blockSize  int
	tokens     int // prompt tokens; 0 for block_hashes input
	// unscored says why the prompt goes on past its keys unscored
	// ("media"); empty when every full block of the prompt has a key.
	unscored string
}

// requestKeys turns a validated query's input into its block keys (into
// *keys, reused) and, for token inputs, into every other applied engine's
// keys (into ek): the one path Score and Pick share. clk times its stages
// (render, tokenize, keys) and each has a span when tracing is on.
func (ix *Indexer) requestKeys(ctx context.Context, q *Query, keys *[]blockkeys.Key, ek *engineKeys, clk *stageClock) (requestInfo, *Error) {
	var in requestInfo
	// A model nobody has published for is known to the interner only once an
	// event arrived; scoring it is legal (nobody holds anything) but the name
	// must at least be given unless events also came without one.
	in.model, in.modelKnown = ix.in.LookupModel(q.Model)
	if q.Model == "" && !in.modelKnown {
		return in, errorf(InvalidArgument, "model is required")
	}
	hasher := ix.hashers.For(q.Model)
	in.blockSize = hasher.Config().BlockSize
	*keys = (*keys)[:0]
	ek.clear()
	var tokens []uint32
	switch q.Kind {
	case InputTokens:
		tokens = q.TokenIDs
	case InputHashes:
		_, span := ix.tr.StartChild(ctx, tracing.SpanKeys)
		for _, h := range q.BlockHashes {
			*keys = append(*keys, blockkeys.Key(h))
		}
		if span.IsRecording() {
			span.SetAttributes(tracing.Blocks.Int(len(*keys)))
		}
		span.End()
		clk.lap(StageKeys)
		return in, nil
	case InputPrompt:
		tctx, span, reuse := ix.startTokenize(ctx)
		var err *Error
		tokens, err = ix.promptTokens(tctx, q)
		endTokenize(span, reuse, len(tokens), err)
		if err != nil {
			return in, err
		}
		clk.lap(StageTokenize)
	case InputMessages:
		chat, err := ix.chatTokens(ctx, q, clk)
		if err != nil {
			return in, err
		}
		tokens, in.unscored = chat.IDs, chat.Unscored
	}
	in.tokens = len(tokens)
	_, span := ix.tr.StartChild(ctx, tracing.SpanKeys)
	hits := ix.tokenKeys(keys, hasher, tokens, q)
	ix.engineTokenKeys(ek, q.Model, tokens, q)
	if span.IsRecording() {
		span.SetAttributes(tracing.Tokens.Int(len(tokens)), tracing.Blocks.Int(len(*keys)), tracing.KeyCacheHits.Int(hits))
	}
	span.End()
	clk.lap(StageKeys)
	return in, nil
}

// startTokenize starts a tokenize span; when it records, the prefix store
// reports its reuse into the returned Reuse (nil otherwise: no allocation
// untraced).
func (ix *Indexer) startTokenize(ctx context.Context) (context.Context, trace.Span, *prefixstore.Reuse) {
	ctx, span := ix.tr.StartChild(ctx, tracing.SpanTokenize)
	if !span.IsRecording() {
		return ctx, span, nil
	}
	reuse := new(prefixstore.Reuse)
	return prefixstore.WithReuse(ctx, reuse), span, reuse
}

func endTokenize(span trace.Span, reuse *prefixstore.Reuse, tokens int, err *Error) {
	if reuse != nil {
		span.SetAttributes(tracing.Tokens.Int(tokens), tracing.ReusedTokens.Int(reuse.Reused), tracing.PrefixStoreHit.Bool(reuse.Hits > 0))
	}
	endStage(span, err)
}

const noTokenizers = "no tokenizers: see --tokenizers-dir, --hf-cache-dir, tokenizer model map"

func (ix *Indexer) promptTokens(ctx context.Context, q *Query) ([]uint32, *Error) {
	if ix.tok == nil {
		return nil, errorf(FailedPrecondition, "prompt scoring is not configured (%s)", noTokenizers)
	}
	var tokens []uint32
	var err error
	if q.AddSpecialTokens != nil && !*q.AddSpecialTokens {
		tokens, err = ix.tok.TokenizeRendered(ctx, q.Model, q.Prompt)
	} else {
		tokens, err = ix.tok.TokenizePrompt(ctx, q.Model, q.Prompt)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxError(ctx.Err())
		}
		if e := promptLimitError("prompt", err); e != nil {
			return nil, e
		}
		return nil, errorf(FailedPrecondition, "tokenize prompt for model %q: %v", q.Model, err)
	}
	if len(tokens) > MaxInputLen {
		return nil, errorf(InvalidArgument, "prompt has %d tokens, limit %d", len(tokens), MaxInputLen)
	}
	return tokens, nil
}

// promptLimitError maps the prefix store's request bounds: a prompt above
// the byte or the token limit is the caller's fault, a full tokenization budget is
// transient. nil for any other error.
func promptLimitError(what string, err error) *Error {
	switch {
	case errors.Is(err, prefixstore.ErrPromptTooLong), errors.Is(err, prefixstore.ErrTooManyTokens):
		return errorf(InvalidArgument, "%s: %v", what, err)
	case errors.Is(err, prefixstore.ErrBusy):
		return errorf(ResourceExhausted, "%s: %v", what, err)
	}
	return nil
}

// chatTokens renders and tokenizes a chat request. A request the template
// refuses (raise_exception, malformed messages) is the caller's fault; a
// model without a usable template or tokenizer is this daemon's limit.
func (ix *Indexer) chatTokens(ctx context.Context, q *Query, clk *stageClock) (chattemplate.Tokens, *Error) {
	if ix.chat == nil {
		return chattemplate.Tokens{}, errorf(FailedPrecondition, "chat scoring is not configured (%s)", noTokenizers)
	}
	addSpecial := q.AddSpecialTokens != nil && *q.AddSpecialTokens
	// One call renders and tokenizes: both spans are recorded after the
	// fact from the renderer's measured render time.
	start := time.Now()
	tctx, reuse := ctx, (*prefixstore.Reuse)(nil)
	if ix.tr.On() && trace.SpanFromContext(ctx).IsRecording() {
		reuse = new(prefixstore.Reuse)
		tctx = prefixstore.WithReuse(ctx, reuse)
	}
	tokens, err := ix.chat.TokenizeChat(tctx, q.Model, q.Chat, addSpecial)
	e := chatError(ctx, q, err)
	if e == nil && len(tokens.IDs) > MaxInputLen {
		e = errorf(InvalidArgument, "rendered messages have %d tokens, limit %d", len(tokens.IDs), MaxInputLen)
	}
	if reuse != nil {
		rendered := start.Add(tokens.Rendered)
		_, rs := ix.tr.StartChild(ctx, tracing.SpanRender, trace.WithTimestamp(start))
		rs.End(trace.WithTimestamp(rendered))
		_, ts := ix.tr.StartChild(ctx, tracing.SpanTokenize, trace.WithTimestamp(rendered))
		endTokenize(ts, reuse, len(tokens.IDs), e)
	}
	if e != nil {
		return chattemplate.Tokens{}, e
	}
	clk.split(StageRender, tokens.Rendered)
	clk.lap(StageTokenize)
	return tokens, nil
}

// chatError maps a chat render or tokenize failure (nil for none). A
// request the template refuses (raise_exception, malformed messages) is the
// caller's fault; a model without a usable template or tokenizer is this
// daemon's limit.
func chatError(ctx context.Context, q *Query, err error) *Error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctxError(ctx.Err())
	}
	if e := promptLimitError("rendered messages", err); e != nil {
		return e
	}
	var re *chattemplate.RequestError
	if errors.As(err, &re) {
		return errorf(InvalidArgument, "messages: %v", err)
	}
	return errorf(FailedPrecondition, "render messages for model %q: %v", q.Model, err)
}

// tokenKeys hashes the full blocks of tokens into *keys, reusing the keys
// of blocks an earlier request already hashed.
func (ix *Indexer) tokenKeys(keys *[]blockkeys.Key, h *blockkeys.Hasher, tokens []uint32, q *Query) (hits int) {
	ix.m.tokens.Observe(float64(len(tokens)))
	*keys, hits = ix.keys.keysHits(h, (*keys)[:0], tokens, blockkeys.RequestExtras{LoraName: q.LoraName, CacheSalt: q.CacheSalt})
	return hits
}

// aggregate folds the scorer's per-(pod, rank) results into one entry per
// pod name, leaving out pods trusted rejects: the best rank decides the
// pod's match, every matching rank is listed.
func (r *Result) aggregate(in *kvindex.Interner, trusted func(kvindex.PodID) bool, order *nameOrder) {
	names := in.PodNames()
	blockSize := int64(r.BlockSize)
	r.entries, r.names, r.ids = r.entries[:0], r.names[:0], r.ids[:0]
	single := true // every entry is rank 0, so each is a different pod name
	for _, ps := range r.res.Pods {
		if !trusted(ps.Pod) {
			continue // its entries may predate a lost removal
		}
		name, rank := names.Name(ps.Pod)
		if r.nameFilter != nil && !slices.Contains(r.nameFilter, name) {
			continue
		}
		single = single && rank == 0
		e := rankEntry{pod: len(r.names), RankScore: RankScore{DPRank: rank, MatchedBlocks: ps.MatchedBlocks, Score: ps.Score}}
		copy(e.Tiers[:], ps.TierBlocks[:])
		copy(e.TierRuns[:], ps.TierRuns[:])
		r.entries = append(r.entries, e)
		r.names = append(r.names, name)
		r.ids = append(r.ids, ps.Pod)
	}
	if !single {
		r.aggregateRanks(blockSize)
		return
	}
	// One rank per pod: sort small keys instead of PodResults, names
	// compared by their precomputed order, then build the pods in order.
	nameRank := order.ranks(names)
	r.order = r.order[:0]
	for i := range r.entries {
		e := &r.entries[i]
		r.order = append(r.order, podKey{score: e.Score, blocks: e.MatchedBlocks, name: nameRank[r.ids[i]], entry: int32(i)})
	}
	r.orderByName(len(nameRank))
	for _, k := range r.order {
		r.ranks = append(r.ranks, r.entries[k.entry].RankScore)
	}
	// Sub-slices are taken only after r.ranks stopped growing.
	for j, k := range r.order {
		best := &r.ranks[j]
		r.Pods = append(r.Pods, PodResult{Pod: r.names[k.entry], Ranks: r.ranks[j : j+1 : j+1],
			MatchedBlocks: best.MatchedBlocks, MatchedTokens: int64(best.MatchedBlocks) * blockSize,
			Score: best.Score, Tiers: best.Tiers, TierRuns: best.TierRuns})
	}
}

// orderByName puts r.order in the answer's order: score and blocks
// descending, then pod name. The scorer's answer comes in score and blocks
// order already (kvindex.ScoreResult) and leaving pods out keeps it, so only
// each run of equal score and blocks is ordered by name: a long run (many
// pods holding the same prefix) by a bitmap over the n name places, a short
// one by insertion.
func (r *Result) orderByName(n int) {
	o := r.order
	byScore := func(a, b *podKey) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(b.blocks, a.blocks)
	}
	for i := 1; i < len(o); i++ {
		if byScore(&o[i-1], &o[i]) > 0 { // not the scorer's order: sort it all
			slices.SortFunc(o, func(a, b podKey) int {
				if c := byScore(&a, &b); c != 0 {
					return c
				}
				return cmp.Compare(a.name, b.name)
			})
			return
		}
	}
	for a := 0; a < len(o); {
		b := a + 1
		for b < len(o) && byScore(&o[a], &o[b]) == 0 {
			b++
		}
		run := o[a:b]
		a = b
		if len(run) <= 32 {
			for i := 1; i < len(run); i++ {
				for j := i; j > 0 && run[j].name < run[j-1].name; j-- {
					run[j], run[j-1] = run[j-1], run[j]
				}
			}
			continue
		}
		if len(r.bits) < (n+63)/64 {
			r.bits = make([]uint64, (n+63)/64)
		}
		if len(r.byPlace) < n {
			r.byPlace = make([]podKey, n)
		}
		for _, k := range run {
			r.bits[k.name/64] |= 1 << (k.name % 64)
			r.byPlace[k.name] = k
		}
		out := run[:0]
		for w := range r.bits[:(n+63)/64] {
			for word := r.bits[w]; word != 0; word &= word - 1 {
				out = append(out, r.byPlace[w*64+bits.TrailingZeros64(word)])
			}
			r.bits[w] = 0
		}
	}
}

// podKey is a pod's place in the answer's order.
type podKey struct {
	score  float64
	blocks int
	name   uint32 // the pod name's place in name order
	entry  int32
}

// aggregateRanks is aggregate for answers where some pod has ranks other
// than 0: the ranks of one pod name are grouped under one PodResult.
func (r *Result) aggregateRanks(blockSize int64) {
	if r.byName == nil {
		r.byName = make(map[string]int)
	}
	for j := range r.entries {
		e := &r.entries[j]
		name := r.names[e.pod]
		i, ok := r.byName[name]
		if !ok {
			i = len(r.Pods)
			r.byName[name] = i
			r.Pods = append(r.Pods, PodResult{Pod: name})
		}
		e.pod = i
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
		p.TierRuns = best.TierRuns
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

// nameOrder is every interned pod's place in the order of pod names (then
// DP ranks), rebuilt when pods were interned since: answers sort pods by
// name among equal scores, and comparing two integers is cheaper than
// comparing two names.
type nameOrder struct {
	mu  sync.Mutex
	cur atomic.Pointer[[]uint32]
}

// ranks returns the order of every pod in names (and maybe more).
func (o *nameOrder) ranks(names kvindex.PodNames) []uint32 {
	if p := o.cur.Load(); p != nil && len(*p) >= names.Len() {
		return *p
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if p := o.cur.Load(); p != nil && len(*p) >= names.Len() {
		return *p
	}
	ids := make([]kvindex.PodID, names.Len())
	for i := range ids {
		ids[i] = kvindex.PodID(i)
	}
	slices.SortFunc(ids, func(a, b kvindex.PodID) int {
		an, ar := names.Name(a)
		bn, br := names.Name(b)
		if c := cmp.Compare(an, bn); c != 0 {
			return c
		}
		return cmp.Compare(ar, br)
	})
	rank := make([]uint32, len(ids))
	for pos, id := range ids {
		rank[id] = uint32(pos)
	}
	o.cur.Store(&rank)
	return rank
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

// sharedModel interns a model this process has not met when the shared index
// holds the query's first block under its name (kvindex.SharedNames), so
// every daemon sharing the index answers the same query the same way. Only
// names the index really holds are interned: a client cannot grow the
// interner with made-up model names.
func (ix *Indexer) sharedModel(ctx context.Context, model string, first blockkeys.Key) (kvindex.ModelID, bool, *Error) {
	ok, err := ix.backend.Names.HasModelKey(ctx, model, first)
	if err != nil {
		if ctx.Err() != nil {
			return 0, false, ctxError(ctx.Err())
		}
		return 0, false, errorf(Unavailable, "index unavailable: %v", err)
	}
	if !ok {
		return 0, false, nil
	}
	ix.m.sharedModels.Inc()
	return ix.in.Model(model), true, nil
}
