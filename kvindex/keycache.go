package kvindex

import (
	"slices"
	"sync"
	"sync/atomic"
)

// KeyCache remembers the block digests the request path computed, so a
// prefix that many requests share (a system prompt, the earlier turns of a
// conversation) is hashed once rather than once per request.
//
// An entry maps (parent digest, block tokens) to the block's digest under one
// Hasher, the model's key config. A lookup finds the entry by a cheap 64-bit
// mix of the parent digest and the tokens and then compares the full parent
// digest and every token, so a hit returns exactly what hashing would: the
// cache can only save work, never change a key.
//
// Only requests without extra keys (no LoRA name, no cache_salt) use it;
// other requests are hashed as before. The table is 4-way set-associative
// with round-robin replacement per set and a lock per stripe of sets, sized
// once (entries, rounded up to a power of two): memory never grows, and a
// lookup or insert allocates nothing.
type KeyCache struct {
	h     *Hasher
	bs    int
	shift uint
	sets  []keyCacheSet
	// toks holds every way's block tokens: way w of set i at (i*cacheWays+w)*bs.
	toks  []uint32
	locks [keyCacheLocks]struct {
		sync.Mutex
		_ [56]byte // keep stripes on separate cache lines
	}

	hits, misses, evictions atomic.Uint64
}

// keyCacheLocks stripes the locks: scoring runs on many goroutines at once.
const keyCacheLocks = 64

// DefaultKeyCacheSize is the default number of cached blocks per key config:
// with 16-token blocks an entry is ~140 bytes, so ~9 MB for 64k blocks (one
// million prompt tokens of distinct prefixes).
const DefaultKeyCacheSize = 1 << 16

type keyCacheSet struct {
	ways
	parent [cacheWays][32]byte
	digest [cacheWays][32]byte
}

// KeyCacheStats are a KeyCache's counters.
type KeyCacheStats struct {
	Capacity                int
	Hits, Misses, Evictions uint64
}

// NewKeyCache returns a cache of about entries blocks for h's key config.
func NewKeyCache(h *Hasher, entries int) *KeyCache {
	n, shift := tableShape(entries)
	bs := h.cfg.BlockSize
	return &KeyCache{h: h, bs: bs, shift: shift, sets: make([]keyCacheSet, n), toks: make([]uint32, n*cacheWays*bs)}
}

// Hasher is the key config the cache serves.
func (c *KeyCache) Hasher() *Hasher { return c.h }

// Stats returns the capacity (blocks) and the counters.
func (c *KeyCache) Stats() KeyCacheStats {
	return KeyCacheStats{Capacity: len(c.sets) * cacheWays, Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load()}
}

// blockTag mixes the parent digest and the block's tokens into the lookup
// tag. It only spreads entries over sets; equality is always checked in full.
func blockTag(parent *[32]byte, tokens []uint32) uint64 {
	t := uint64(parent[0]) | uint64(parent[1])<<8 | uint64(parent[2])<<16 | uint64(parent[3])<<24 |
		uint64(parent[4])<<32 | uint64(parent[5])<<40 | uint64(parent[6])<<48 | uint64(parent[7])<<56
	i := 0
	for ; i+1 < len(tokens); i += 2 { // two tokens per multiply: half the dependent chain
		t = (t ^ (uint64(tokens[i]) | uint64(tokens[i+1])<<32)) * 0xff51afd7ed558ccd
		t ^= t >> 31
	}
	if i < len(tokens) {
		t = (t ^ uint64(tokens[i])) * 0xff51afd7ed558ccd
		t ^= t >> 31
	}
	return t
}

// Keys appends the 64-bit keys of every full block of tokens to dst, exactly
// as c.Hasher().Keys would, hashing only the blocks the cache does not hold.
// Safe for concurrent use; it allocates only when dst must grow.
func (c *KeyCache) Keys(dst []Key, tokens []uint32, extras RequestExtras) []Key {
	h := c.h
	if extras != (RequestExtras{}) {
		return h.Keys(dst, tokens, extras)
	}
	var sp *[]byte
	var buf []byte
	var hits, misses, evictions uint64
	parent := h.none
	var ek extraKeys // zero: extra keys None on every block
	bs := c.bs
	for i := 0; i+bs <= len(tokens); i += bs {
		blk := tokens[i : i+bs]
		tag := blockTag(&parent, blk)
		var d [32]byte
		if c.get(tag, &parent, blk, &d) {
			hits++
		} else {
			if sp == nil {
				sp = getScratch()
				buf = *sp
			}
			var err error
			if buf, d, err = h.digest(buf, parent[:h.dlen], blk, &ek); err != nil {
				break // cannot happen without string extras; Hasher.Keys stops the same way
			}
			misses++
			if c.put(tag, &parent, blk, &d) {
				evictions++
			}
		}
		dst = append(dst, keyOf(&d, h.dlen))
		parent = d
	}
	if sp != nil {
		putScratch(sp, buf)
	}
	c.hits.Add(hits)
	c.misses.Add(misses)
	if evictions > 0 {
		c.evictions.Add(evictions)
	}
	return dst
}

func (c *KeyCache) get(tag uint64, parent *[32]byte, blk []uint32, out *[32]byte) bool {
	i := setIndex(tag, c.shift)
	l := &c.locks[i%keyCacheLocks]
	l.Lock()
	s := &c.sets[i]
	found := false
	for w := 0; w < cacheWays; w++ {
		if s.valid&(1<<w) == 0 || s.keys[w] != tag || s.parent[w] != *parent {
			continue
		}
		off := (int(i)*cacheWays + w) * c.bs
		if slices.Equal(c.toks[off:off+c.bs], blk) {
			*out = s.digest[w]
			found = true
			break
		}
	}
	l.Unlock()
	return found
}

// put stores a computed digest; it reports whether a valid entry was replaced.
func (c *KeyCache) put(tag uint64, parent *[32]byte, blk []uint32, d *[32]byte) bool {
	i := setIndex(tag, c.shift)
	l := &c.locks[i%keyCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w := s.slot(tag)
	evicted := s.valid&(1<<w) != 0
	s.parent[w], s.digest[w] = *parent, *d
	off := (int(i)*cacheWays + w) * c.bs
	copy(c.toks[off:off+c.bs], blk)
	s.fill(w, tag)
	l.Unlock()
	return evicted
}
