package kvindex

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockkeys"
)

// The lock-free read path (see MemoryIndex for the seqlock protocol).

type lookupBuf struct {
	raw     []uint64
	holders []Holder
}

// Lookup calls v.Visit for keys in order with each key's live holders,
// stopping at the first key without one or when Visit returns false.
func (idx *MemoryIndex) Lookup(ctx context.Context, model ModelID, keys []blockkeys.Key, v Visitor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := idx.bufs.Get().(*lookupBuf)
	salt := modelSalt(model)
	for i, k := range keys {
		sk := uint64(k) ^ salt
		h := mix64(sk)
		b.raw, _, _ = idx.shardOf(h).read(h, sk, b.raw[:0])
		hs := b.holders[:0]
		for _, h := range b.raw {
			if idx.isLive(h) {
				hs = append(hs, Holder{Pod: holderPod(h), Tier: holderTier(h)})
			}
		}
		b.holders = hs
		if len(hs) == 0 || !v.Visit(i, k, hs) {
			break
		}
	}
	idx.bufs.Put(b)
	return nil
}

// read appends a consistent copy of the packed holders of stored key sk
// (hashed h, in this shard), stale ones included, to dst, and returns the
// key's value word (ref bit cleared, 0 if the key is absent) and holder-set
// signature (see head). Lock-free unless writers keep the shard changing
// (readSpins): see MemoryIndex.
func (sh *shard) read(h, sk uint64, dst []uint64) (out []uint64, v, sig uint64) {
	for spins := 0; spins < readSpins; spins++ {
		if out, v, sig, ok := sh.tryRead(h, sk, dst); ok {
			return out, v, sig
		}
		sh.awaitWriter()
	}
	sh.mu.Lock()
	out, v, sig, ok := sh.tryRead(h, sk, dst)
	sh.mu.Unlock()
	if !ok { // cannot happen: no writer changes the shard now
		return dst, 0, 0
	}
	return out, v, sig
}

// tryRead is one attempt of read; ok=false: a writer changed the shard
// meanwhile.
func (sh *shard) tryRead(h, sk uint64, dst []uint64) (out []uint64, v, sig uint64, ok bool) {
	s1 := sh.seq.Load()
	if s1&1 != 0 {
		return dst, 0, 0, false
	}
	v = sh.probe(h, sk) &^ refBit
	switch {
	case v == 0:
		return dst, 0, 0, sh.seq.Load() == s1
	case v&tagMask == tagInline:
		return append(dst, v&holderMask), v, v, sh.seq.Load() == s1
	}
	out, sig, ok = sh.readChunk(v, dst)
	if !ok || sh.seq.Load() != s1 {
		return dst, 0, 0, false
	}
	return out, v, sig, true
}

// readSpins is how many times a reader tries the shard without its lock
// before it waits for the writer's lock instead (a writer changing the
// shard without pause, or descheduled in the middle of a change). Between
// tries it waits for the change under way to end (awaitWriter): a writer
// changes one key at a time, a few hundred nanoseconds, so a reader nearly
// never needs the lock. Waiting for the lock costs far more than the change:
// the unlocking writer wakes the reader onto its own P's next slot, where it
// waits until the writer's goroutine stops, up to a scheduler time slice
// (milliseconds in the Mooncake replay at GOMAXPROCS 2, docs/performance.md).
// Yielding (runtime.Gosched) was worse: it puts the reader in the global run
// queue behind every runnable goroutine. Under the lock the shard's sequence
// is even and still, so the read succeeds at once.
const readSpins = 16

// awaitLoads bounds awaitWriter: at most this many loads of the shard's
// sequence, a few microseconds, per failed try.
const awaitLoads = 256

// awaitWriter returns once the shard's sequence is even (no change under
// way) or after awaitLoads loads of it, whichever comes first.
func (sh *shard) awaitWriter() {
	for i := 0; i < awaitLoads && sh.seq.Load()&1 != 0; i++ {
	}
}

// head returns stored key sk's value word (ref bit cleared, 0 if absent)
// and its holder-set signature, both from one consistent state of the
// shard, without copying holders. The signature of a chunk is its stored
// sum of holderSig; that of an inline holder is the value word itself.
// Equal signatures mean equal holder sets (a 64-bit hash collision aside).
func (sh *shard) head(h, sk uint64) (v, sig uint64) {
	for spins := 0; spins < readSpins; spins++ {
		s1, v := sh.headStart(h, sk)
		if sig, ok := sh.headFinish(s1, v); ok {
			return v, sig
		}
		sh.awaitWriter()
	}
	sh.mu.Lock()
	s1, v := sh.headStart(h, sk)
	sig, ok := sh.headFinish(s1, v)
	sh.mu.Unlock()
	if !ok { // cannot happen: no writer changes the shard now
		return 0, 0
	}
	return v, sig
}

// headStart and headFinish are one attempt of head, split so that a caller
// reading many keys can issue all their slot loads before it needs any
// chunk: the cache misses then overlap. headStart returns the shard's
// sequence number and the key's value word (ref bit cleared).
func (sh *shard) headStart(h, sk uint64) (s1, v uint64) {
	s1 = sh.seq.Load()
	// probe, inlined: this runs once per scored key
	t := *sh.tab.Load()
	m := uint64(len(t) - 1) // len(t) is a power of two
	j := h * slotWords
	for n := len(t) / slotWords; n > 0; n-- {
		j &= m
		if j+1 >= uint64(len(t)) {
			break
		}
		w := atomic.LoadUint64(&t[j+1])
		if w == 0 || atomic.LoadUint64(&t[j]) == sk {
			return s1, w &^ refBit
		}
		j += slotWords
	}
	return s1, 0
}

// headFinish returns the signature of value word v read by headStart, and
// whether both are consistent (else the caller retries).
func (sh *shard) headFinish(s1, v uint64) (sig uint64, ok bool) {
	sig = v
	if v&tagMask == tagChunk {
		a := *sh.arena.Load()
		off := v & offMask
		if off >= uint64(len(a)) {
			return 0, false // torn
		}
		sig = atomic.LoadUint64(&a[off])
	}
	return sig, s1&1 == 0 && sh.seq.Load() == s1
}

// chunkHas reports whether stored key sk still has chunk value v with
// signature sig, and x among its holders, all in one consistent state.
func (sh *shard) chunkHas(h, sk, v, sig, x uint64) bool {
	for spins := 0; spins < readSpins; spins++ {
		if has, ok := sh.tryChunkHas(h, sk, v, sig, x); ok {
			return has
		}
		sh.awaitWriter()
	}
	sh.mu.Lock()
	has, _ := sh.tryChunkHas(h, sk, v, sig, x) // holds: no writer now
	sh.mu.Unlock()
	return has
}

// tryChunkHas is one attempt of chunkHas; ok=false: a writer changed the
// shard meanwhile.
func (sh *shard) tryChunkHas(h, sk, v, sig, x uint64) (has, ok bool) {
	s1 := sh.seq.Load()
	if s1&1 != 0 {
		return false, false
	}
	if sh.probe(h, sk)&^refBit == v {
		c, off := uint64(valCount(v)), v&offMask
		a := *sh.arena.Load()
		if off+1+c <= uint64(len(a)) && atomic.LoadUint64(&a[off]) == sig {
			hs := a[off+1 : off+1+c]
			lo, hi := 0, len(hs)
			for lo < hi {
				m := int(uint(lo+hi) >> 1)
				if atomic.LoadUint64(&hs[m]) < x {
					lo = m + 1
				} else {
					hi = m
				}
			}
			has = lo < len(hs) && atomic.LoadUint64(&hs[lo]) == x
		}
	}
	return has, sh.seq.Load() == s1
}

// probe returns the value word of stored key sk (0 if absent). The caller
// validates it with the shard's sequence number.
func (sh *shard) probe(h, sk uint64) uint64 {
	t := *sh.tab.Load()
	mask := uint64(len(t)/slotWords - 1)
	i := h & mask
	for n := uint64(0); n <= mask; n++ {
		j := i * slotWords
		if j+1 >= uint64(len(t)) {
			return 0
		}
		v := atomic.LoadUint64(&t[j+1])
		if v == 0 || atomic.LoadUint64(&t[j]) == sk {
			return v
		}
		i = (i + 1) & mask
	}
	return 0
}

// readChunk appends the holders of chunk value v to dst and returns their
// signature. ok is false for a torn (inconsistent) value.
func (sh *shard) readChunk(v uint64, dst []uint64) (out []uint64, sig uint64, ok bool) {
	if v&tagMask != tagChunk {
		return dst, 0, false
	}
	c, off := uint64(valCount(v)), v&offMask
	a := *sh.arena.Load()
	if c > 1<<valClass(v) || off+1+c > uint64(len(a)) {
		return dst, 0, false
	}
	sig = atomic.LoadUint64(&a[off])
	n := len(dst)
	dst = slices.Grow(dst, int(c))[:n+int(c)]
	src := a[off+1 : off+1+c]
	for j := range src {
		dst[n+j] = atomic.LoadUint64(&src[j])
	}
	return dst, sig, true
}

// touch loads the home slot of hashed key h so that a later read finds it
// in cache. The load is atomic, so it stays even though its value is unused.
func (sh *shard) touch(h uint64) {
	t := *sh.tab.Load()
	i := int(h) & (len(t)/slotWords - 1)
	atomic.LoadUint64(&t[i*slotWords+1])
}

// touchChunk loads the first word of the chunk that hashed key h's home
// slot points to, if it points to one (see touchGroup).
func (sh *shard) touchChunk(h uint64) {
	t := *sh.tab.Load()
	i := int(h) & (len(t)/slotWords - 1)
	v := atomic.LoadUint64(&t[i*slotWords+1])
	if v&tagMask != tagChunk {
		return
	}
	a := *sh.arena.Load()
	if off := int(v & offMask); off < len(a) {
		atomic.LoadUint64(&a[off])
	}
}
