package kvindex

import (
	"context"
	"runtime"
	"sync/atomic"
)

// The lock-free read path (see MemoryIndex for the seqlock protocol).

type lookupBuf struct {
	raw     []uint64
	holders []Holder
}

// Lookup calls v.Visit for keys in order with each key's live holders,
// stopping at the first key without one or when Visit returns false.
func (idx *MemoryIndex) Lookup(ctx context.Context, model ModelID, keys []Key, v Visitor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := idx.bufs.Get().(*lookupBuf)
	salt := modelSalt(model)
	for i, k := range keys {
		sk := uint64(k) ^ salt
		h := mix64(sk)
		b.raw, _, _, _ = idx.shardOf(h).read(h, sk, b.raw[:0], 0, false)
		hs := b.holders[:0]
		for _, h := range b.raw {
			if idx.isLive(h) {
				hs = append(hs, Holder{Pod: holderPod(h), Tier: holderTier(h), Group: holderGroup(h)})
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
// holder set's signature. When skip is set and the signature equals
// skipSig, it copies nothing and reports same. Lock-free: see MemoryIndex.
func (sh *shard) read(h, sk uint64, dst []uint64, skipSig uint64, skip bool) (out []uint64, sig uint64, found, same bool) {
	for spins := 0; ; spins++ {
		s1 := sh.seq.Load()
		if s1&1 == 0 {
			v := sh.probe(h, sk)
			switch {
			case v == 0:
				if sh.seq.Load() == s1 {
					return dst, 0, false, false
				}
			case v&tagMask == tagInline:
				if sh.seq.Load() == s1 {
					sig = v &^ refBit
					if skip && sig == skipSig {
						return dst, sig, true, true
					}
					return append(dst, v&holderMask), sig, true, false
				}
			default:
				if out, sig, ok := sh.readChunk(v, dst, skipSig, skip); ok && sh.seq.Load() == s1 {
					return out, sig, true, skip && sig == skipSig
				}
			}
		}
		if spins > 16 {
			runtime.Gosched() // the writer may have been descheduled
		}
	}
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

// readChunk copies the holders of chunk value v unless their signature
// equals skipSig. ok is false for a torn (inconsistent) value.
func (sh *shard) readChunk(v uint64, dst []uint64, skipSig uint64, skip bool) (out []uint64, sig uint64, ok bool) {
	if v&tagMask != tagChunk {
		return dst, 0, false
	}
	c, off := uint64(valCount(v)), v&offMask
	a := *sh.arena.Load()
	if c > 1<<valClass(v) || off+1+c > uint64(len(a)) {
		return dst, 0, false
	}
	sig = atomic.LoadUint64(&a[off])
	if skip && sig == skipSig {
		return dst, sig, true
	}
	for j := off + 1; j <= off+c; j++ {
		dst = append(dst, atomic.LoadUint64(&a[j]))
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
