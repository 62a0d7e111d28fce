package tokenization

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// bpeModel is HF's BPE model (tokenizers/src/models/bpe).
type bpeModel struct {
	vocab        map[string]uint32 // keyed by raw bytes when raw is set
	raw          bool              // words are raw bytes of a byte-level model
	byteIDs      [256]int32        // raw mode: id of each single byte, -1 if absent
	fallbackIDs  [256]int32        // byte_fallback: id of "<0xXX>", -1 if absent
	merges       pairMap           // a<<32|b -> rank<<32|merged id
	ignoreMerges bool
	byteFallback bool
	fuseUnk      bool
	unkID        int64 // -1: no unk token
	prefix       string
	suffix       string
	cache        *wordCache
	heapPool     sync.Pool
	// seg bounds the ids of a long word before it is merged (bound.go);
	// built on first need (segReady closes then), nil when the merge table
	// cannot be expanded.
	segOnce  sync.Once
	segReady chan struct{}
	seg      *segAutomaton
}

func parseBPE(raw json.RawMessage) (*bpeModel, error) {
	var typ struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &typ); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if typ.Type != "BPE" && typ.Type != "" {
		return nil, fmt.Errorf("unsupported model %q (only BPE)", typ.Type)
	}
	var j bpeJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if j.Dropout != nil && *j.Dropout != 0 && *j.Dropout != 1 {
		// dropout is a training-time feature; HF only applies it when
		// explicitly enabled, and inference servers never set it.
		return nil, fmt.Errorf("unsupported BPE dropout %v", *j.Dropout)
	}
	m := &bpeModel{vocab: j.Vocab, ignoreMerges: j.IgnoreMerges, byteFallback: j.ByteFallback, fuseUnk: j.FuseUnk, unkID: -1}
	if j.ContinuingSubwordPrefix != nil {
		m.prefix = *j.ContinuingSubwordPrefix
	}
	if j.EndOfWordSuffix != nil {
		m.suffix = *j.EndOfWordSuffix
	}
	if j.UnkToken != nil {
		id, ok := m.vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("BPE unk_token %q not in vocab", *j.UnkToken)
		}
		m.unkID = int64(id)
	}
	for b := 0; b < 256; b++ {
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = int32(id)
		}
	}
	pairs, err := parseMerges(j.Merges)
	if err != nil {
		return nil, err
	}
	m.merges = newPairMap(len(pairs))
	for rank, p := range pairs {
		a, ok1 := m.vocab[p[0]]
		b, ok2 := m.vocab[p[1]]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("BPE merge %d (%q %q): token not in vocab", rank, p[0], p[1])
		}
		merged := p[0] + strings.TrimPrefix(p[1], m.prefix)
		id, ok := m.vocab[merged]
		if !ok {
			return nil, fmt.Errorf("BPE merge %d: merged token %q not in vocab", rank, merged)
		}
		// the first (lowest-ranked) occurrence of a pair wins, as in HF
		m.merges.putIfAbsent(uint64(a)<<32|uint64(b), uint64(rank)<<32|uint64(id))
	}
	m.cache = newWordCache(1 << 16)
	m.heapPool.New = func() any { return new(bpeWork) }
	return m, nil
}

// parseMerges accepts both forms: ["a b", ...] and [["a","b"], ...].
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("BPE merge %d %q: no space", i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("BPE merges: %w", err)
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("BPE merge %d has %d parts", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// useRawBytes re-keys the vocabulary by raw bytes so byte-level words need
// no byte-to-unicode mapping at encode time.
func (m *bpeModel) useRawBytes() {
	rv := make(map[string]uint32, len(m.vocab))
	for k, id := range m.vocab {
		if r, ok := byteLevelDecode(k); ok {
			rv[r] = id
		}
	}
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := m.vocab[string(byteLevelChars[b])]; ok {
			m.byteIDs[b] = int32(id)
		}
	}
	m.vocab = rv
	m.raw = true
}

type bpeSym struct {
	id         uint32
	prev, next int32
	live       bool
}

type bpeMerge struct {
	rank  uint32
	pos   int32
	newID uint32
}

type bpeWork struct {
	syms []bpeSym
	heap []bpeMerge
}

// encodeWord appends the ids of one pre-tokenized word. A word is one
// pre-token, which can be as long as the text (a run of letters with no
// space), so merging checks ctx as it goes and returns its error once done.
// budget >= 0 is the most ids the caller still accepts: a word whose ids
// provably number more (bound.go) is refused with errWordOverBudget before
// it is merged.
func (m *bpeModel) encodeWord(ctx context.Context, dst []uint32, w string, budget int) ([]uint32, error) {
	if w == "" {
		return dst, nil
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id), nil
		}
	}
	cacheable := len(w) <= maxCachedWord
	if cacheable {
		if ids, ok := m.cache.get(w); ok {
			return append(dst, ids...), nil
		}
	}
	// A word has at most one initial symbol per byte, and BPE never gives
	// more ids than initial symbols: only a word longer than the budget can
	// pass it. A short word is merged and then counted, cheaper than the
	// bound (and than building its automaton).
	if len(w) < minBoundedWord {
		budget = -1
	}
	if budget >= 0 && len(w) > budget && m.raw {
		// byte-level: bounded from the bytes, before any symbol is made
		if err := m.checkBound(ctx, len(w), budget, func(emit func(uint32) bool) error {
			for i := 0; i < len(w); i++ {
				if i%mergeCheckEvery == mergeCheckEvery-1 {
					if err := ctx.Err(); err != nil {
						return err
					}
				}
				// as initialSymbols: a byte with no id is unk, or nothing
				if id := m.byteIDs[w[i]]; id >= 0 {
					if !emit(uint32(id)) {
						return nil
					}
				} else if m.unkID >= 0 && !emit(uint32(m.unkID)) {
					return nil
				}
			}
			return nil
		}); err != nil {
			return dst, err
		}
	}
	wk := m.heapPool.Get().(*bpeWork)
	wk.syms = m.initialSymbols(wk.syms[:0], w)
	if budget >= 0 && len(wk.syms) > budget && !m.raw {
		syms := wk.syms
		if err := m.checkBound(ctx, len(syms), budget, func(emit func(uint32) bool) error {
			for i := range syms {
				if i%mergeCheckEvery == mergeCheckEvery-1 {
					if err := ctx.Err(); err != nil {
						return err
					}
				}
				if !emit(syms[i].id) {
					return nil
				}
			}
			return nil
		}); err != nil {
			m.putWork(wk)
			return dst, err
		}
	}
	if err := m.mergeAll(ctx, wk); err != nil {
		m.putWork(wk)
		return dst, err
	}
	start := len(dst)
	for i := range wk.syms {
		if wk.syms[i].live {
			dst = append(dst, wk.syms[i].id)
		}
	}
	if cacheable {
		m.cache.put(w, dst[start:])
	}
	m.putWork(wk)
	return dst, nil
}

// minBoundedWord is the shortest word whose ids are bounded before it is
// merged: merging 1 KiB takes tens of microseconds.
const minBoundedWord = 1 << 10

// checkBound is errWordOverBudget when a word of n initial symbols (fed
// by feed) provably gives more than budget ids; ctx's error if it ends.
func (m *bpeModel) checkBound(ctx context.Context, n, budget int, feed func(emit func(uint32) bool) error) error {
	seg, err := m.segAutomaton(ctx)
	if err != nil || seg == nil {
		return err
	}
	lb, err := seg.segmentBound(n, feed)
	if err != nil {
		return err
	}
	if lb > budget {
		return errWordOverBudget
	}
	return nil
}

// segAutomaton is the model's bound automaton (nil: none), built once on
// first need. The build takes ~0.7 s of CPU for a 150k-token vocabulary, so
// it runs on its own: a request that ends meanwhile returns at once and the
// build finishes for the next one.
func (m *bpeModel) segAutomaton(ctx context.Context) (*segAutomaton, error) {
	m.segOnce.Do(func() {
		m.segReady = make(chan struct{})
		go func() {
			m.seg = m.buildSegAutomaton()
			close(m.segReady)
		}()
	})
	select {
	case <-m.segReady:
		return m.seg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// maxPooledSymbols bounds the buffers kept for reuse: one long word (a prompt
// that is a single run of letters) needs ~28 bytes per byte, which the pool
// would otherwise hold on to after the request.
const maxPooledSymbols = 1 << 16

func (m *bpeModel) putWork(wk *bpeWork) {
	if cap(wk.syms) > maxPooledSymbols || cap(wk.heap) > maxPooledSymbols {
		return
	}
	m.heapPool.Put(wk)
}

func (m *bpeModel) addSym(syms []bpeSym, id uint32) []bpeSym {
	n := int32(len(syms))
	return append(syms, bpeSym{id: id, prev: n - 1, next: n + 1, live: true})
}

func (m *bpeModel) initialSymbols(syms []bpeSym, w string) []bpeSym {
	if m.raw {
		for i := 0; i < len(w); i++ {
			if id := m.byteIDs[w[i]]; id >= 0 {
				syms = m.addSym(syms, uint32(id))
			} else if m.unkID >= 0 {
				syms = m.addSym(syms, uint32(m.unkID))
			}
		}
		return fixLinks(syms)
	}
	unkPending := false
	var sb strings.Builder
	for i := 0; i < len(w); {
		_, sz := utf8.DecodeRuneInString(w[i:])
		end := i + sz
		s := w[i:end]
		if (i > 0 && m.prefix != "") || (end == len(w) && m.suffix != "") {
			sb.Reset()
			if i > 0 {
				sb.WriteString(m.prefix)
			}
			sb.WriteString(s)
			if end == len(w) {
				sb.WriteString(m.suffix)
			}
			s = sb.String()
		}
		if id, ok := m.vocab[s]; ok {
			if unkPending {
				syms = m.addSym(syms, uint32(m.unkID))
				unkPending = false
			}
			syms = m.addSym(syms, id)
			i = end
			continue
		}
		if m.byteFallback {
			all := true
			for k := 0; k < len(s); k++ {
				if m.fallbackIDs[s[k]] < 0 {
					all = false
					break
				}
			}
			if all {
				// HF pushes the byte tokens without flushing a pending unk
				for k := 0; k < len(s); k++ {
					syms = m.addSym(syms, uint32(m.fallbackIDs[s[k]]))
				}
				i = end
				continue
			}
		}
		if m.unkID >= 0 {
			if unkPending && !m.fuseUnk {
				syms = m.addSym(syms, uint32(m.unkID))
			}
			unkPending = true
		}
		i = end
	}
	if unkPending {
		syms = m.addSym(syms, uint32(m.unkID))
	}
	return fixLinks(syms)
}

func fixLinks(syms []bpeSym) []bpeSym {
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func (m *bpeModel) lookup(a, b uint32) (rank, id uint32, ok bool) {
	v, ok := m.merges.get(uint64(a)<<32 | uint64(b))
	return uint32(v >> 32), uint32(v), ok
}

// mergeCheckEvery is how many queue pops pass between two checks of the
// request's context: about a millisecond of merging.
const mergeCheckEvery = 1 << 14

// mergeAll is HF's Word::merge_all: repeatedly apply the lowest-ranked merge
// (leftmost on ties) using a priority queue with lazy invalidation, so a word
// of n symbols takes O(n log n) (each merge pushes at most two candidates).
func (m *bpeModel) mergeAll(ctx context.Context, wk *bpeWork) error {
	syms := wk.syms
	if len(syms) < 2 {
		return nil
	}
	h := wk.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if r, id, ok := m.lookup(syms[i].id, syms[i+1].id); ok {
			h = heapPush(h, bpeMerge{r, int32(i), id})
		}
	}
	for pops := 1; len(h) > 0; pops++ {
		if pops%mergeCheckEvery == 0 {
			if err := ctx.Err(); err != nil {
				wk.heap = h[:0]
				return err
			}
		}
		var top bpeMerge
		top, h = heapPop(h)
		s := &syms[top.pos]
		if !s.live || s.next < 0 {
			continue
		}
		right := syms[s.next]
		if _, id, ok := m.lookup(s.id, right.id); !ok || id != top.newID {
			continue
		}
		s.id = top.newID
		syms[s.next].live = false
		s.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if s.prev >= 0 {
			if r, id, ok := m.lookup(syms[s.prev].id, s.id); ok {
				h = heapPush(h, bpeMerge{r, s.prev, id})
			}
		}
		if s.next >= 0 {
			if r, id, ok := m.lookup(s.id, syms[s.next].id); ok {
				h = heapPush(h, bpeMerge{r, top.pos, id})
			}
		}
	}
	wk.heap = h
	return nil
}

func mergeLess(a, b bpeMerge) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

func heapPush(h []bpeMerge, x bpeMerge) []bpeMerge {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !mergeLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []bpeMerge) (bpeMerge, []bpeMerge) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && mergeLess(h[r], h[l]) {
			c = r
		}
		if !mergeLess(h[c], h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}

// maxCachedWord bounds the words kept in the cache (long words are rare and
// would dominate its memory).
const maxCachedWord = 64

// wordCache is a bounded, sharded, concurrent word -> ids cache. A full shard
// is emptied (cheap, keeps memory bounded, hot words come back at once).
type wordCache struct {
	seed   maphash.Seed
	shards [32]cacheShard
	per    int
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

func newWordCache(capacity int) *wordCache {
	c := &wordCache{seed: maphash.MakeSeed(), per: capacity / 32}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)&31]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	s := c.shard(w)
	v := append([]uint32(nil), ids...)
	k := strings.Clone(w)
	s.mu.Lock()
	if len(s.m) >= c.per {
		clear(s.m)
	}
	s.m[k] = v
	s.mu.Unlock()
}

// pairMap is an open-addressing hash map from a merge pair to its rank and
// result: merge lookups dominate BPE time and this is several times faster
// than a Go map for uint64 keys.
type pairMap struct {
	slots []pairSlot
	mask  uint64
	shift uint
}

type pairSlot struct{ key, val uint64 }

// emptyPair cannot be a real key: ids are below 2^32-1.
const emptyPair = ^uint64(0)

func newPairMap(n int) pairMap {
	size, bits := 16, uint(4)
	for size < n*2 {
		size *= 2
		bits++
	}
	m := pairMap{slots: make([]pairSlot, size), mask: uint64(size - 1), shift: 64 - bits}
	for i := range m.slots {
		m.slots[i].key = emptyPair
	}
	return m
}

func (m *pairMap) putIfAbsent(k, v uint64) {
	for h := (k * 0x9E3779B97F4A7C15) >> m.shift; ; h = (h + 1) & m.mask {
		s := &m.slots[h]
		if s.key == k {
			return
		}
		if s.key == emptyPair {
			s.key, s.val = k, v
			return
		}
	}
}

func (m *pairMap) get(k uint64) (uint64, bool) {
	for h := (k * 0x9E3779B97F4A7C15) >> m.shift; ; h = (h + 1) & m.mask {
		s := &m.slots[h]
		if s.key == k {
			return s.val, true
		}
		if s.key == emptyPair {
			return 0, false
		}
	}
}
