// Package prefixstore caches prompt-prefix -> token ids per model so that long
// shared prefixes (system prompts, conversation history) are not re-tokenized on
// every request, while producing exactly the ids full tokenization would.
//
// The prompt is cut into fixed-size byte chunks; chunk i is keyed by a hash chained
// over chunks 0..i, so a key names a whole prefix. Each cached chunk stores the exact
// chunk bytes (compared on lookup, so a hash collision cannot return wrong ids), one
// "safe" tokenizer boundary inside the prefix it ends, and the ids between the previous
// chunk's boundary and its own. A request reuses the ids up to the last safe boundary of
// its longest cached chunk chain and tokenizes only the rest (Tokenizer.EncodeSuffix).
//
// Safe boundary. A boundary B of text T (where T's pre-tokenization split, from
// Tokenizer.EncodeBoundaries) is reused for any prompt Q that shares T's first E bytes.
// That is exact only if nothing after E can change the splits before B. We keep B at or
// before safeLimit(E):
//   - at least margin bytes before E, margin >= 2x the longest added token + 16, so an
//     added token (leftmost-longest match) that would straddle E cannot start before B;
//   - then two whole character-class runs (classes: Unicode whitespace, \p{N}, other)
//     further back. Greedy regex pieces of every supported pre-tokenizer (\s+(?!\S),
//     \s*[\r\n]+, \p{L}+, [\p{L}\p{M}]+, [^\s\p{L}\p{N}]+[\r\n]*, \p{N}{1,3}, ...) stay
//     inside one such run, plus a trailing newline run and one character of lookahead,
//     so the pieces ending at or before B are decided by bytes before E, and so are
//     normalizers (NFC/NFKC reach back only to the last stable starter, which the
//     whitespace/number run provides).
//
// This is "stop before the last pre-tokenizer split boundary inside the
// matched prefix", made precise. The property tests check it against full tokenization.
package prefixstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kvindex/kvindex/internal/bytebudget"
	"github.com/kvindex/kvindex/tokenization"
	"github.com/zeebo/xxh3"
)

// Defaults for Config zero values.
const (
	DefaultChunkBytes = 256
	DefaultCapacity   = 32768 // chunks per model: 8 MiB of distinct prompt text
	// DefaultMaxPromptBytes is twice the text of the longest contexts served
	// today (1M tokens at ~4 bytes per token of English or code; CJK text
	// takes fewer bytes per token).
	DefaultMaxPromptBytes = 8 << 20
	// DefaultMaxInflightBytes lets two prompts of the largest size (or many
	// usual ones) be tokenized at once. Tokenizing holds up to ~64 bytes of
	// memory per prompt byte (measured RSS for a prompt that is one run of
	// CJK characters: a symbol and queue entries per byte, ids, GC headroom),
	// so the budget bounds that to about 1 GB.
	DefaultMaxInflightBytes = 16 << 20
)

// inflightWait is how long a prompt waits for room in the in-flight budget
// before it is refused: a few tokenizations of the largest prompts.
const inflightWait = 2 * time.Second

// ErrPromptTooLong is returned for a prompt above Config.MaxPromptBytes (the
// caller's fault: an InvalidArgument); ErrBusy when the prompts being
// tokenized hold the in-flight budget for longer than inflightWait (a
// ResourceExhausted: retry later).
var (
	ErrPromptTooLong = errors.New("prompt too long")
	ErrBusy          = errors.New("tokenization budget in use")
	// ErrTooManyTokens is returned once a prompt's ids pass
	// Config.MaxPromptTokens: tokenization stops there (the caller's fault:
	// an InvalidArgument).
	ErrTooManyTokens = tokenization.ErrTooManyTokens
)

// DefaultMaxPromptTokens is the longest prompt in ids, the bound on a
// query's token_ids (indexer.MaxInputLen; a test keeps them equal).
const DefaultMaxPromptTokens = 1 << 20

// Config configures a Store.
type Config struct {
	ChunkBytes int // bytes per chunk; 0 = DefaultChunkBytes
	Capacity   int // max cached chunks per model (LRU beyond); 0 = DefaultCapacity
	// MaxPromptBytes refuses longer prompts (rendered chats included) before
	// any work; 0 = DefaultMaxPromptBytes.
	MaxPromptBytes int
	// MaxInflightBytes bounds the bytes of the prompts being tokenized at
	// once (the memory tokenization holds); others wait for room. 0 =
	// DefaultMaxInflightBytes; raised to MaxPromptBytes when below it.
	MaxInflightBytes int
	// MaxPromptTokens refuses a prompt whose ids number more, as soon as
	// the tokenizer passes it (not after the whole prompt); 0 =
	// DefaultMaxPromptTokens.
	MaxPromptTokens int
}

// Store is the prefix cache for all models. Safe for concurrent use.
type Store struct {
	cfg Config
	reg *tokenization.Registry
	m   *Metrics

	inflight *bytebudget.Budget

	mu sync.Mutex
	// One cache per tokenizer and mode, not per model name: names that
	// resolve to the same tokenizer ("org/x" and "x", any "*/x" found in a
	// tokenizers dir) share it, so request-chosen names cannot multiply the
	// memory bound. The mode (add_special_tokens) is part of the key because
	// the ids of one text differ by the tokens it adds.
	models map[storeKey]*modelStore
}

type storeKey struct {
	tok        *tokenization.Tokenizer
	addSpecial bool
}

// New returns a Store that loads tokenizers from reg. m may be nil (no metrics).
func New(cfg Config, reg *tokenization.Registry, m *Metrics) *Store {
	// A negative size, which ValidateConfig refuses, is read as unset here:
	// New has no error to return.
	cfg.ChunkBytes, cfg.Capacity = max(cfg.ChunkBytes, 0), max(cfg.Capacity, 0)
	cfg.MaxPromptBytes, cfg.MaxInflightBytes = max(cfg.MaxPromptBytes, 0), max(cfg.MaxInflightBytes, 0)
	cfg = cfg.withDefaults()
	cfg.MaxInflightBytes = max(cfg.MaxInflightBytes, cfg.MaxPromptBytes)
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Store{cfg: cfg, reg: reg, m: m, models: map[storeKey]*modelStore{},
		inflight: bytebudget.New(cfg.MaxInflightBytes, m.inflightBytes)}
}

// Stats is a snapshot of one tokenizer's cache in one mode.
type Stats struct {
	Model string // the first model name served from this cache
	// AddSpecialTokens is the mode: true for prompts (TokenizePrompt), false
	// for rendered chats (TokenizeRendered).
	AddSpecialTokens bool
	Chunks           int
	Evictions        uint64
}

// Stats lists every model's cache size, sorted by model.
func (s *Store) Stats() []Stats {
	s.mu.Lock()
	out := make([]Stats, 0, len(s.models))
	for k, ms := range s.models {
		ms.mu.Lock()
		out = append(out, Stats{Model: ms.name, AddSpecialTokens: k.addSpecial, Chunks: len(ms.nodes), Evictions: ms.evictions})
		ms.mu.Unlock()
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return !out[i].AddSpecialTokens && out[j].AddSpecialTokens
	})
	return out
}

// TokenizePrompt returns the ids of prompt for model with /v1/completions semantics
// (add_special_tokens=true, so BOS where the model's post-processor adds it). The
// result always equals the tokenizer's Encode(prompt, true).
func (s *Store) TokenizePrompt(ctx context.Context, model, prompt string) ([]uint32, error) {
	return s.tokenize(ctx, model, prompt, true)
}

// TokenizeRendered returns the ids of a rendered chat prompt for model with
// add_special_tokens=false, as vLLM tokenizes the output of a chat template
// (the template writes BOS and the other special tokens itself). The result
// always equals the tokenizer's Encode(prompt, false). A growing conversation
// re-renders to a text that extends the previous turn's, so its unchanged
// prefix comes from the cache.
func (s *Store) TokenizeRendered(ctx context.Context, model, prompt string) ([]uint32, error) {
	return s.tokenize(ctx, model, prompt, false)
}

// Reuse receives what tokenizations under one context took from the store:
// a traced request attaches one (WithReuse) and reports it as span
// attributes. Counts only, never the text or the ids.
type Reuse struct {
	// Tokens is the ids returned; Reused how many of them came from the
	// store (a cached prefix); Hits the calls that found a prefix.
	Tokens, Reused, Hits int
}

type reuseKey struct{}

// WithReuse returns ctx carrying r: every tokenization under it adds to r.
// r must not be shared between goroutines.
func WithReuse(ctx context.Context, r *Reuse) context.Context {
	return context.WithValue(ctx, reuseKey{}, r)
}

func (s *Store) tokenize(ctx context.Context, model, prompt string, addSpecial bool) ([]uint32, error) {
	ids, reused, err := s.tokenizeReuse(ctx, model, prompt, addSpecial)
	if err == nil {
		if r, ok := ctx.Value(reuseKey{}).(*Reuse); ok {
			r.Tokens += len(ids)
			r.Reused += reused
			if reused > 0 {
				r.Hits++
			}
		}
	}
	return ids, err
}

func (s *Store) tokenizeReuse(ctx context.Context, model, prompt string, addSpecial bool) ([]uint32, int, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if len(prompt) > s.cfg.MaxPromptBytes {
		s.m.refused.WithLabelValues("too_long").Inc()
		return nil, 0, fmt.Errorf("%w: %d bytes, limit %d (--max-prompt-bytes)", ErrPromptTooLong, len(prompt), s.cfg.MaxPromptBytes)
	}
	tok, err := s.reg.Get(model)
	if err != nil {
		s.m.errors.Inc()
		return nil, 0, err
	}
	if err := s.inflight.Acquire(ctx, len(prompt), inflightWait); err != nil {
		if errors.Is(err, bytebudget.ErrBusy) {
			s.m.refused.WithLabelValues("busy").Inc()
			return nil, 0, fmt.Errorf("%w: %d prompt bytes are being tokenized (--tokenize-max-inflight-bytes %d); retry later", ErrBusy, s.inflight.Used(), s.cfg.MaxInflightBytes)
		}
		return nil, 0, err
	}
	defer s.inflight.Release(len(prompt))
	ms := s.modelStore(storeKey{tok, addSpecial}, model)
	margin := 2*tok.MaxAddedTokenBytes() + 16

	c := s.cfg.ChunkBytes
	nChunks := len(prompt) / c
	hashes := make([]uint64, nChunks)
	var h uint64
	for i := range hashes {
		h = xxh3.HashStringSeed(prompt[i*c:(i+1)*c], h)
		hashes[i] = h
	}

	matched, bound, segs := ms.lookup(prompt, c, hashes)
	var ids []uint32
	hit := bound.Offset > 0
	if hit {
		ids = make([]uint32, 0, bound.Tokens+(len(prompt)-bound.Offset)/3+8)
		for _, sg := range segs {
			ids = append(ids, sg...)
		}
		if len(ids) != bound.Tokens {
			// Cannot happen if the invariants hold; never return ids we cannot vouch for.
			s.m.inconsistent.Inc()
			hit = false
		}
	}
	if !hit {
		s.m.misses.Inc()
		full, bounds, err := tok.EncodeBoundariesLimit(ctx, prompt, addSpecial, s.cfg.MaxPromptTokens)
		if err != nil {
			return nil, 0, s.encodeError(ctx, model, err)
		}
		if nChunks > 0 {
			ms.insert(prompt, c, margin, hashes, 0, tokenization.Boundary{}, full, bounds)
		}
		s.observe(start, len(full), 0)
		return full, 0, nil
	}

	s.m.hits.Inc()
	reused := len(ids)
	// the suffix's boundaries let the prompt's new chunks be cached too
	// reused < MaxPromptTokens: cached prefixes come from prompts that were
	// under it, but a later, lower limit is still honoured
	suffix, sb, err := tok.EncodeSuffixBoundariesLimit(ctx, prompt, bound.Offset, addSpecial, max(s.cfg.MaxPromptTokens-reused, 1))
	if err != nil {
		return nil, 0, s.encodeError(ctx, model, err)
	}
	ids = append(ids, suffix...)
	if matched < nChunks {
		ms.insert(prompt, c, margin, hashes, matched, bound, ids, sb)
	}
	s.observe(start, len(ids), reused)
	return ids, reused, nil
}

// encodeError counts and wraps an encode's error. Too many tokens is a
// refusal, named with the limit as the indexer's own token_ids bound is.
func (s *Store) encodeError(ctx context.Context, model string, err error) error {
	if errors.Is(err, tokenization.ErrTooManyTokens) {
		s.m.refused.WithLabelValues("too_many_tokens").Inc()
		return fmt.Errorf("%w: more than the limit %d", ErrTooManyTokens, s.cfg.MaxPromptTokens)
	}
	s.countError(ctx)
	return fmt.Errorf("tokenize prompt for model %q: %w", model, err)
}

// countError counts a tokenization failure; a request that was cancelled or
// timed out is not one: the tokenizer stopped because it ended.
func (s *Store) countError(ctx context.Context) {
	if ctx.Err() != nil {
		s.m.cancelled.Inc()
		return
	}
	s.m.errors.Inc()
}

func (s *Store) observe(start time.Time, tokens, reused int) {
	s.m.latency.Observe(time.Since(start).Seconds())
	s.m.tokensPerRequest.Observe(float64(tokens))
	s.m.tokens.Add(float64(tokens))
	s.m.reusedTokens.Add(float64(reused))
}

func (s *Store) modelStore(k storeKey, model string) *modelStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	ms, ok := s.models[k]
	if !ok {
		ms = newModelStore(model, s.cfg.Capacity, s.m)
		s.models[k] = ms
	}
	return ms
}

// node is one cached chunk. Immutable after insertion except for the LRU links, so
// seg may be read after the store lock is released.
type node struct {
	hash, parent uint64
	index        int    // chunk index in the prompt
	chunk        string // exact bytes of the chunk (owned copy, not a prompt substring)
	// boundary is the last safe boundary at or before this chunk's end (Offset 0 =
	// none yet); seg holds the ids from the previous chunk's boundary to this one.
	boundary   tokenization.Boundary
	seg        []uint32
	prev, next *node // LRU list, most recent first
}

type modelStore struct {
	name      string
	m         *Metrics
	mu        sync.Mutex
	capacity  int
	nodes     map[uint64]*node
	lru       node // sentinel: lru.next = most recent, lru.prev = least recent
	evictions uint64
}

func newModelStore(name string, capacity int, m *Metrics) *modelStore {
	ms := &modelStore{name: name, m: m, capacity: capacity, nodes: map[uint64]*node{}}
	ms.lru.next, ms.lru.prev = &ms.lru, &ms.lru
	return ms
}

// lookup walks the chunk chain from the first chunk and returns how many chunks match,
// the boundary to reuse up to and the id segments that precede it (their concatenation
// has bound.Tokens ids).
func (ms *modelStore) lookup(prompt string, c int, hashes []uint64) (matched int, bound tokenization.Boundary, segs [][]uint32) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var parent uint64
	var path []*node
	for i, h := range hashes {
		n := ms.nodes[h]
		if n == nil || n.parent != parent || n.index != i || n.chunk != prompt[i*c:(i+1)*c] {
			break
		}
		path = append(path, n)
		parent = h
	}
	// Touch deepest first so parents end up more recent than children: LRU then
	// evicts leaves before the chunks other prefixes depend on.
	for i := len(path) - 1; i >= 0; i-- {
		ms.touch(path[i])
	}
	if len(path) == 0 {
		return 0, tokenization.Boundary{}, nil
	}
	bound = path[len(path)-1].boundary
	if bound.Offset == 0 {
		return len(path), tokenization.Boundary{}, nil
	}
	segs = make([][]uint32, 0, len(path))
	for _, n := range path {
		if len(n.seg) > 0 {
			segs = append(segs, n.seg)
		}
	}
	return len(path), bound, segs
}

// insert caches chunks from..len(hashes)-1 of prompt. ids are the prompt's full ids;
// bounds are boundaries of ids after prev (the matched chain's boundary, zero when
// from == 0); for from > 0 their Tokens count from prev.Tokens.
func (ms *modelStore) insert(prompt string, c, margin int, hashes []uint64, from int, prev tokenization.Boundary, ids []uint32, bounds []tokenization.Boundary) {
	base := 0
	if from > 0 {
		base = prev.Tokens
	}
	// floor only rises: safeLimit is monotonic in the end offset, and prev.Offset is at
	// or below every later limit. The limits come from one forward scan of the new text
	// (runScanner), so the loop is linear in it even inside one very long run, where
	// every limit is the floor and a walk back from each chunk would be quadratic.
	floor := prev.Offset
	rs := newRunScanner(prompt, floor)
	newNodes := make([]*node, 0, len(hashes)-from)
	bi := 0
	cur := prev
	for i := from; i < len(hashes); i++ {
		lo := cur.Tokens // the previous chunk's boundary: this chunk's ids start there
		limit := rs.limit((i+1)*c, margin, floor)
		floor = limit
		for bi < len(bounds) && bounds[bi].Offset <= limit {
			if b := bounds[bi]; b.Offset > cur.Offset {
				cur = tokenization.Boundary{Offset: b.Offset, Tokens: base + b.Tokens}
			}
			bi++
		}
		var parent uint64
		if i > 0 {
			parent = hashes[i-1]
		}
		n := &node{hash: hashes[i], parent: parent, index: i, boundary: cur}
		if cur.Tokens > len(ids) || lo > cur.Tokens {
			ms.m.inconsistent.Inc()
			return
		}
		if cur.Tokens > lo {
			n.seg = append([]uint32(nil), ids[lo:cur.Tokens]...)
		}
		newNodes = append(newNodes, n)
	}

	ms.mu.Lock()
	defer ms.mu.Unlock()
	for i := len(newNodes) - 1; i >= 0; i-- {
		n := newNodes[i]
		if old := ms.nodes[n.hash]; old != nil {
			ms.touch(old) // same prefix already cached (or a collision: keep the old one)
			continue
		}
		n.chunk = strings.Clone(prompt[n.index*c : (n.index+1)*c]) // do not pin the prompt
		ms.nodes[n.hash] = n
		ms.pushFront(n)
		ms.m.chunks.Inc()
	}
	for len(ms.nodes) > ms.capacity {
		old := ms.lru.prev
		ms.unlink(old)
		delete(ms.nodes, old.hash)
		ms.evictions++
		ms.m.evictions.Inc()
		ms.m.chunks.Dec()
	}
}

func (ms *modelStore) unlink(n *node) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (ms *modelStore) pushFront(n *node) {
	n.prev, n.next = &ms.lru, ms.lru.next
	ms.lru.next.prev = n
	ms.lru.next = n
}

func (ms *modelStore) touch(n *node) {
	if ms.lru.next == n {
		return
	}
	ms.unlink(n)
	ms.pushFront(n)
}

// Character classes for safeLimit. Every greedy piece of the supported pre-tokenizer
// regexes stays within one run of one class (see the package comment).
const (
	classSpace = iota
	classNumber
	classOther
)

func class(r rune) int {
	if r < utf8.RuneSelf {
		switch {
		case r == ' ' || (r >= '\t' && r <= '\r'):
			return classSpace
		case r >= '0' && r <= '9':
			return classNumber
		}
		return classOther
	}
	switch {
	case unicode.IsSpace(r):
		return classSpace
	case unicode.IsNumber(r):
		return classNumber
	}
	return classOther
}

// safeLimit is the last offset a reused boundary may have when only s[:end] is known:
// end - margin, moved back over the run containing the character before it and over
// one more whole run. 0 means nothing is safe. floor must be a lower bound of the
// result (an earlier result or an already safe boundary); the walk stops there.
func safeLimit(s string, end, margin, floor int) int {
	p := end - margin
	// Never start inside a character: a partial UTF-8 sequence would decode as a
	// separate "other" run. Moving back only makes the result more conservative.
	for p > floor && p < len(s) && !utf8.RuneStart(s[p]) {
		p--
	}
	if p <= floor {
		return floor
	}
	for run := 0; run < 2; run++ {
		r, sz := utf8.DecodeLastRuneInString(s[:p])
		c := class(r)
		for p -= sz; p > floor; p -= sz {
			if r, sz = utf8.DecodeLastRuneInString(s[:p]); class(r) != c {
				break
			}
		}
		if p <= floor {
			return floor
		}
	}
	return p
}

// runScanner computes safeLimit for non-decreasing ends in time linear in the text
// scanned: it reads the text forward once from its start offset and remembers where the
// run containing the last character read starts, and where the run before it starts.
// Those are the two run starts safeLimit walks back to, so no character is read twice.
type runScanner struct {
	s         string
	pos       int // the text before pos has been read
	cls       int // class of the character before pos; -1 when nothing was read
	cur, prev int // starts of its run and of the run before (-1: none after the start)
}

func newRunScanner(s string, start int) *runScanner {
	return &runScanner{s: s, pos: start, cls: -1, cur: -1, prev: -1}
}

// limit is safeLimit(s, end, margin, floor), for floor at or above the scanner's start
// and ends that do not decrease between calls.
func (rs *runScanner) limit(end, margin, floor int) int {
	p := end - margin
	for p > floor && p < len(rs.s) && !utf8.RuneStart(rs.s[p]) {
		p--
	}
	if p <= floor {
		return floor
	}
	if p < rs.pos {
		return safeLimit(rs.s, end, margin, floor) // an end moved back: not how insert calls it
	}
	for rs.pos < p {
		r, sz := utf8.DecodeRuneInString(rs.s[rs.pos:])
		if c := class(r); c != rs.cls {
			rs.prev, rs.cur, rs.cls = rs.cur, rs.pos, c
		}
		rs.pos += sz
	}
	if rs.pos != p {
		// p split an invalid sequence differently from the forward decode; the plain
		// walk handles it (it cannot happen on valid UTF-8)
		return safeLimit(rs.s, end, margin, floor)
	}
	if rs.cur <= floor || rs.prev <= floor {
		return floor
	}
	return rs.prev
}
