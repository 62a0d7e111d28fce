package blockkeys

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/internal/setassoc"
)

// KeyCache remembers the block digests the request path computed, so a
// prefix that many requests share (a system prompt, the earlier turns of a
// conversation) is hashed once rather than once per request.
//
// An entry maps (parent digest, block tokens) to the block's digest under one
// Hasher, the model's key config. A lookup finds the entry by a 64-bit tag
// and then compares the full parent digest and every token, so a hit returns
// exactly what hashing would: the cache can only save work, never change a
// key.
//
// The tag chains the block's tokens onto the previous block's tag, never onto
// a digest, so a block's set does not depend on its parent's lookup (a
// prefetching pass built on that measured no gain and was dropped), and a
// tag is unique per way (put replaces a way holding the same tag). Readers take no lock: each set carries a sequence
// number that a writer makes odd while it rewrites the set, and a reader that
// sees it odd or changed treats the lookup as a miss and hashes. Every field
// a reader touches is an atomic word, so this is race-free under the Go
// memory model, and on amd64 and arm64 those loads are plain loads.
//
// Only requests without extra keys (no LoRA name, no cache_salt) use it;
// other requests are hashed as before. The table is 4-way set-associative
// with round-robin replacement per set and a writer lock per stripe of sets,
// sized once (entries, rounded up to a power of two): memory never grows,
// and a lookup or insert allocates nothing.
type KeyCache struct {
	h     *Hasher
	bs    int
	words int // atomic words per way's tokens: two tokens per word
	shift uint
	sets  []keyCacheSet
	// toks holds every way's block tokens, two per word: way w of set i at
	// (i*setassoc.Ways+w)*words.
	toks  []atomic.Uint64
	locks [keyCacheLocks]struct {
		sync.Mutex
		_ [56]byte // keep stripes on separate cache lines
	}

	hits, misses, evictions atomic.Uint64
}

// keyCacheLocks stripes the writer locks: scoring runs on many goroutines.
const keyCacheLocks = 64

// DefaultKeyCacheSize is the default number of cached blocks per key config:
// with 16-token blocks an entry is ~140 bytes, so ~9 MB for 64k blocks (one
// million prompt tokens of distinct prefixes).
const DefaultKeyCacheSize = 1 << 16

type keyCacheSet struct {
	seq    atomic.Uint64                   // odd while a writer rewrites the set
	tags   [setassoc.Ways]atomic.Uint64    // 0: empty way (real tags are odd)
	parent [setassoc.Ways][4]atomic.Uint64 // parent digest, little-endian words
	digest [setassoc.Ways][4]atomic.Uint64
	next   uint8 // round-robin victim; only touched under the stripe lock
}

// KeyCacheStats are a KeyCache's counters.
type KeyCacheStats struct {
	Capacity                int
	Hits, Misses, Evictions uint64
}

// NewKeyCache returns a cache of about entries blocks for h's key config.
func NewKeyCache(h *Hasher, entries int) *KeyCache {
	n, shift := setassoc.TableShape(entries)
	bs := h.cfg.BlockSize
	words := (bs + 1) / 2
	return &KeyCache{h: h, bs: bs, words: words, shift: shift, sets: make([]keyCacheSet, n),
		toks: make([]atomic.Uint64, n*setassoc.Ways*words)}
}

// Hasher is the key config the cache serves.
func (c *KeyCache) Hasher() *Hasher { return c.h }

// Stats returns the capacity (blocks) and the counters.
func (c *KeyCache) Stats() KeyCacheStats {
	return KeyCacheStats{Capacity: len(c.sets) * setassoc.Ways, Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}

// blockTag chains a block's tokens onto the previous block's tag. It only
// spreads entries over sets and tells ways apart cheaply; equality is always
// checked in full. The result is odd, so 0 can mark an empty way.
func blockTag(prev uint64, tokens []uint32) uint64 {
	t := prev ^ 0x9E3779B97F4A7C15
	i := 0
	for ; i+1 < len(tokens); i += 2 { // two tokens per multiply: half the dependent chain
		t = (t ^ (uint64(tokens[i]) | uint64(tokens[i+1])<<32)) * 0xff51afd7ed558ccd
		t ^= t >> 31
	}
	if i < len(tokens) {
		t = (t ^ uint64(tokens[i])) * 0xff51afd7ed558ccd
		t ^= t >> 31
	}
	return t | 1
}

// tokenWord packs tokens 2j and 2j+1 of a block (0 past its end).
func tokenWord(blk []uint32, j int) uint64 {
	w := uint64(blk[2*j])
	if 2*j+1 < len(blk) {
		w |= uint64(blk[2*j+1]) << 32
	}
	return w
}

// Keys appends the 64-bit keys of every full block of tokens to dst, exactly
// as c.Hasher().Keys would, hashing only the blocks the cache does not hold.
// Safe for concurrent use; it allocates only when dst must grow.
func (c *KeyCache) Keys(dst []Key, tokens []uint32, extras RequestExtras) []Key {
	dst, _ = c.KeysHits(dst, tokens, extras)
	return dst
}

// KeysHits is Keys that also returns how many of the keys came from the
// cache (a request's trace span reports it).
func (c *KeyCache) KeysHits(dst []Key, tokens []uint32, extras RequestExtras) ([]Key, int) {
	h := c.h
	// Pair pages (SGLang with EAGLE) also hash the token after the page,
	// which the cache's (parent, block) entries do not hold: not cached.
	if extras != (RequestExtras{}) || h.pairs {
		return h.Keys(dst, tokens, extras), 0
	}
	var sp *[]byte
	var buf []byte
	var hits, misses, evictions uint64
	parent, plen := h.Root()
	var extraKeys ExtraKeys // zero: extra keys None on every block
	bs := c.bs
	tag := uint64(0)
	for i := 0; i+bs <= len(tokens); i += bs {
		blk := tokens[i : i+bs]
		// The tag depends on tokens only, never on a digest; the parent
		// digest is what get verifies.
		tag = blockTag(tag, blk)
		var d [32]byte
		if c.get(tag, &parent, blk, &d) {
			hits++
		} else {
			if sp == nil {
				sp = getScratch()
				buf = *sp
			}
			var err error
			if buf, d, err = h.BlockDigest(buf, parent[:plen], blk, &extraKeys); err != nil {
				break // cannot happen without string extras; Hasher.Keys stops the same way
			}
			misses++
			if c.put(tag, &parent, blk, &d) {
				evictions++
			}
		}
		dst = append(dst, h.DigestKey(&d))
		parent, plen = d, h.dlen
	}
	if sp != nil {
		putScratch(sp, buf)
	}
	c.hits.Add(hits)
	c.misses.Add(misses)
	if evictions > 0 {
		c.evictions.Add(evictions)
	}
	return dst, int(hits)
}

// get looks tag up without a lock: it succeeds only if the set was not
// being rewritten before or during the read and a way holds exactly
// (parent, blk).
func (c *KeyCache) get(tag uint64, parent *[32]byte, blk []uint32, out *[32]byte) bool {
	i := setassoc.SetIndex(tag, c.shift)
	s := &c.sets[i]
	seq := s.seq.Load()
	if seq&1 != 0 {
		return false
	}
	for w := 0; w < setassoc.Ways; w++ {
		if s.tags[w].Load() != tag {
			continue
		}
		for k := 0; k < 4; k++ {
			if s.parent[w][k].Load() != binary.LittleEndian.Uint64(parent[8*k:]) {
				return false
			}
		}
		toks := c.toks[(int(i)*setassoc.Ways+w)*c.words:]
		for j := 0; j < c.words; j++ {
			if toks[j].Load() != tokenWord(blk, j) {
				return false
			}
		}
		for k := 0; k < 4; k++ {
			binary.LittleEndian.PutUint64(out[8*k:], s.digest[w][k].Load())
		}
		return s.seq.Load() == seq
	}
	return false
}

// put stores a computed digest; it reports whether an entry for another
// block was replaced (an eviction). Finding this very block already stored
// is not one (a racing Keys stored it after this one's get missed, or get
// missed only because the set was being rewritten): the way is left as it
// is, its digest being the one d would write.
func (c *KeyCache) put(tag uint64, parent *[32]byte, blk []uint32, d *[32]byte) bool {
	i := setassoc.SetIndex(tag, c.shift)
	l := &c.locks[i%keyCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w, evicted := -1, false
	for k := 0; k < setassoc.Ways; k++ {
		if t := s.tags[k].Load(); t == tag {
			// Under the stripe lock no writer rewrites the set, so get
			// answers exactly whether the way holds (parent, blk).
			var held [32]byte
			if c.get(tag, parent, blk, &held) {
				l.Unlock()
				return false
			}
			w = k // same tag, another block: replace in place, never keep two ways of one tag
			evicted = true
			break
		} else if t == 0 && w < 0 {
			w = k
		}
	}
	if w < 0 {
		w = int(s.next)
		s.next = uint8((w + 1) % setassoc.Ways)
		evicted = true
	}
	s.seq.Add(1) // odd: readers of this set miss until the rewrite is done
	s.tags[w].Store(tag)
	for k := 0; k < 4; k++ {
		s.parent[w][k].Store(binary.LittleEndian.Uint64(parent[8*k:]))
		s.digest[w][k].Store(binary.LittleEndian.Uint64(d[8*k:]))
	}
	toks := c.toks[(int(i)*setassoc.Ways+w)*c.words:]
	for j := 0; j < c.words; j++ {
		toks[j].Store(tokenWord(blk, j))
	}
	s.seq.Add(1)
	l.Unlock()
	return evicted
}
