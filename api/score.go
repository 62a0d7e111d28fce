package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/kvindex"
)

// PromptTokenizer turns a /v1/completions prompt into the token ids vLLM
// would compute for it (add_special_tokens as vLLM applies it). The daemon
// passes the prefix store; nil turns prompt scoring off.
type PromptTokenizer interface {
	TokenizePrompt(ctx context.Context, model, prompt string) ([]uint32, error)
}

// Error is a request failure with the gRPC code both transports map from
// (InvalidArgument -> HTTP 400, Unavailable -> 503, ...).
type Error struct {
	Code codes.Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(c codes.Code, format string, args ...any) *Error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// inputKind names the request's input for metrics and errors.
type inputKind uint8

const (
	inputNone inputKind = iota
	inputTokens
	inputHashes
	inputPrompt
)

var inputKindNames = [...]string{"none", "token_ids", "block_hashes", "prompt"}

func (k inputKind) String() string { return inputKindNames[k] }

// scoreQuery is a transport-neutral score request. Slices are borrowed from
// the transport's decoded request and only read.
type scoreQuery struct {
	model     string
	kind      inputKind
	tokens    []uint32
	hashes    []uint64
	prompt    string
	loraName  string
	cacheSalt string
	pods      []string
}

// TierCounts are the blocks of a matched run per storage tier.
type TierCounts [kvindex.NumTiers]int32

// RankScore is one data-parallel rank's match.
type RankScore struct {
	DPRank        int
	MatchedBlocks int
	Score         float64
	Tiers         TierCounts
}

// PodResult is one pod (all its DP ranks) in a score answer. The pod's match
// is its best rank's: a request is served by exactly one rank.
type PodResult struct {
	Pod           string
	MatchedBlocks int
	MatchedTokens int64
	Score         float64
	Tiers         TierCounts
	Ranks         []RankScore // best first
}

// scoreAnswer is the transport-neutral result; pooled with its buffers.
type scoreAnswer struct {
	TotalBlocks int
	Pods        []PodResult

	keys    []kvindex.Key
	cands   []kvindex.PodID
	res     kvindex.ScoreResult
	ranks   []RankScore
	entries []rankEntry
	byName  map[string]int
}

var answerPool = sync.Pool{New: func() any {
	return &scoreAnswer{byName: make(map[string]int)}
}}

func getAnswer() *scoreAnswer { return answerPool.Get().(*scoreAnswer) }

func putAnswer(a *scoreAnswer) {
	// Drop oversized buffers so one huge request does not pin memory.
	if cap(a.keys) > 1<<16 {
		a.keys = nil
	}
	clear(a.byName)
	for i := range a.Pods {
		a.Pods[i] = PodResult{}
	}
	a.Pods = a.Pods[:0]
	a.ranks = a.ranks[:0]
	answerPool.Put(a)
}

// maxInputLen bounds one request (tokens or block hashes) so a client cannot
// make the daemon hash or look up unbounded input.
const maxInputLen = 1 << 20

func (q *scoreQuery) validate() *Error {
	if q.kind == inputNone {
		return errorf(codes.InvalidArgument, "one of token_ids, block_hashes or prompt is required (non-empty)")
	}
	switch q.kind {
	case inputTokens:
		if len(q.tokens) == 0 {
			return errorf(codes.InvalidArgument, "token_ids is empty")
		}
		if len(q.tokens) > maxInputLen {
			return errorf(codes.InvalidArgument, "token_ids has %d entries, limit %d", len(q.tokens), maxInputLen)
		}
	case inputHashes:
		if len(q.hashes) == 0 {
			return errorf(codes.InvalidArgument, "block_hashes is empty")
		}
		if len(q.hashes) > maxInputLen {
			return errorf(codes.InvalidArgument, "block_hashes has %d entries, limit %d", len(q.hashes), maxInputLen)
		}
		if q.loraName != "" || q.cacheSalt != "" {
			return errorf(codes.InvalidArgument, "lora_name and cache_salt apply to token_ids or prompt, not to block_hashes (they are already part of the hashes)")
		}
	case inputPrompt:
		if q.prompt == "" {
			return errorf(codes.InvalidArgument, "prompt is empty")
		}
		if q.model == "" {
			return errorf(codes.InvalidArgument, "model is required to tokenize a prompt")
		}
	}
	for _, p := range q.pods {
		if p == "" {
			return errorf(codes.InvalidArgument, "pods contains an empty name")
		}
	}
	return nil
}

// score runs one request: input -> keys -> index lookup -> per-pod results.
// The caller must putAnswer the result.
func (s *Server) score(ctx context.Context, q *scoreQuery) (*scoreAnswer, *Error) {
	start := time.Now()
	a, err := s.scoreInner(ctx, q)
	code := codes.OK
	if err != nil {
		code = err.Code
	}
	s.metrics.observeRequest(q.kind, code, time.Since(start))
	return a, err
}

func (s *Server) scoreInner(ctx context.Context, q *scoreQuery) (*scoreAnswer, *Error) {
	if err := q.validate(); err != nil {
		return nil, err
	}
	// A model nobody has published for is known to the interner only once an
	// event arrived; scoring it is legal (nobody holds anything) but the name
	// must at least be given unless events also came without one.
	modelID, modelKnown := s.cfg.Interner.LookupModel(q.model)
	if q.model == "" && !modelKnown {
		return nil, errorf(codes.InvalidArgument, "model is required")
	}
	hasher := s.cfg.Hashers.For(q.model)
	blockSize := hasher.Config().BlockSize

	a := getAnswer()
	switch q.kind {
	case inputTokens:
		s.tokenKeys(a, hasher, q.tokens, q)
	case inputHashes:
		a.keys = a.keys[:0]
		for _, h := range q.hashes {
			a.keys = append(a.keys, kvindex.Key(h))
		}
	case inputPrompt:
		if s.cfg.Tokenizer == nil {
			putAnswer(a)
			return nil, errorf(codes.FailedPrecondition, "prompt scoring is not configured (no tokenizers: see --tokenizers-dir, --hf-cache-dir, tokenizer model map)")
		}
		tokens, err := s.cfg.Tokenizer.TokenizePrompt(ctx, q.model, q.prompt)
		if err != nil {
			putAnswer(a)
			if ctx.Err() != nil {
				return nil, ctxError(ctx.Err())
			}
			return nil, errorf(codes.FailedPrecondition, "tokenize prompt for model %q: %v", q.model, err)
		}
		s.tokenKeys(a, hasher, tokens, q)
	}
	a.TotalBlocks = len(a.keys)

	var cands []kvindex.PodID
	if len(q.pods) > 0 {
		a.cands = a.cands[:0]
		for _, name := range q.pods {
			a.cands = append(a.cands, s.cfg.Interner.PodsNamed(name)...)
		}
		cands = a.cands
	}
	// Nothing can match: unknown model, no full block, or a pod filter that
	// names no known pod. Answer empty without touching the index, except
	// that an index that is down must still be reported as down.
	if !modelKnown || len(a.keys) == 0 || (len(q.pods) > 0 && len(cands) == 0) {
		if err := s.healthy(ctx); err != nil {
			putAnswer(a)
			return nil, errorf(codes.Unavailable, "index unavailable: %v", err)
		}
		return a, nil
	}

	t0 := time.Now()
	err := s.cfg.Scorer.Score(ctx, modelID, a.keys, cands, &a.res)
	s.metrics.lookup.Observe(time.Since(t0).Seconds())
	if err != nil {
		putAnswer(a)
		if ctx.Err() != nil {
			return nil, ctxError(ctx.Err())
		}
		return nil, errorf(codes.Unavailable, "index lookup failed: %v", err)
	}
	s.aggregate(a, int64(blockSize))
	return a, nil
}

// tokenKeys hashes the full blocks of tokens into a.keys.
func (s *Server) tokenKeys(a *scoreAnswer, h *kvindex.Hasher, tokens []uint32, q *scoreQuery) {
	s.metrics.tokens.Observe(float64(len(tokens)))
	a.keys = h.Keys(a.keys[:0], tokens, kvindex.RequestExtras{LoraName: q.loraName, CacheSalt: q.cacheSalt})
}

// aggregate folds the scorer's per-(pod, rank) results into one entry per pod
// name: the best rank decides the pod's match, every matching rank is listed.
func (s *Server) aggregate(a *scoreAnswer, blockSize int64) {
	a.entries = a.entries[:0]
	for _, ps := range a.res.Pods {
		if s.trust != nil && !s.trust.Trusted(ps.Pod) {
			continue // its entries may predate a lost removal
		}
		name, rank := s.cfg.Interner.PodName(ps.Pod)
		i, ok := a.byName[name]
		if !ok {
			i = len(a.Pods)
			a.byName[name] = i
			a.Pods = append(a.Pods, PodResult{Pod: name})
		}
		e := rankEntry{pod: i, RankScore: RankScore{DPRank: rank, MatchedBlocks: ps.MatchedBlocks, Score: ps.Score}}
		copy(e.Tiers[:], ps.TierBlocks[:])
		a.entries = append(a.entries, e)
	}
	slices.SortFunc(a.entries, func(x, y rankEntry) int {
		if c := cmp.Compare(x.pod, y.pod); c != 0 {
			return c
		}
		return compareRank(&x.RankScore, &y.RankScore)
	})
	a.ranks = a.ranks[:0]
	for _, e := range a.entries {
		a.ranks = append(a.ranks, e.RankScore)
	}
	// Sub-slices are taken only after a.ranks stopped growing.
	for start := 0; start < len(a.entries); {
		end := start + 1
		for end < len(a.entries) && a.entries[end].pod == a.entries[start].pod {
			end++
		}
		p := &a.Pods[a.entries[start].pod]
		p.Ranks = a.ranks[start:end:end]
		best := p.Ranks[0]
		p.MatchedBlocks = best.MatchedBlocks
		p.MatchedTokens = int64(best.MatchedBlocks) * blockSize
		p.Score = best.Score
		p.Tiers = best.Tiers
		start = end
	}
	slices.SortFunc(a.Pods, func(x, y PodResult) int {
		if c := cmp.Compare(y.Score, x.Score); c != 0 {
			return c
		}
		if c := cmp.Compare(y.MatchedBlocks, x.MatchedBlocks); c != 0 {
			return c
		}
		return cmp.Compare(x.Pod, y.Pod)
	})
}

// compareRank orders ranks best first: score, then blocks, then lower rank.
func compareRank(x, y *RankScore) int {
	if c := cmp.Compare(y.Score, x.Score); c != 0 {
		return c
	}
	if c := cmp.Compare(y.MatchedBlocks, x.MatchedBlocks); c != 0 {
		return c
	}
	return cmp.Compare(x.DPRank, y.DPRank)
}

type rankEntry struct {
	pod int
	RankScore
}

func (s *Server) healthy(ctx context.Context) error {
	if s.health == nil {
		return nil
	}
	return s.health.Healthy(ctx)
}

func ctxError(err error) *Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errorf(codes.DeadlineExceeded, "deadline exceeded")
	}
	return errorf(codes.Canceled, "request canceled")
}
