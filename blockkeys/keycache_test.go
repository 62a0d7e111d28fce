package blockkeys

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// keyCachePrompts builds prompts that share prefixes the way chat traffic
// does: a few system prompts, each continued by several conversations.
func keyCachePrompts(r *rand.Rand, n, blocks, bs int) [][]uint32 {
	systems := make([][]uint32, 3)
	for i := range systems {
		systems[i] = randTokens(r, (blocks/2)*bs+r.IntN(bs))
	}
	out := make([][]uint32, n)
	for i := range out {
		p := slices.Clone(systems[r.IntN(len(systems))])
		out[i] = append(p, randTokens(r, r.IntN(blocks/2*bs)+1)...)
	}
	return out
}

func randTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(200000))
	}
	return t
}

func TestKeyCacheEqualsHasher(t *testing.T) {
	for _, algo := range HashAlgos {
		t.Run(string(algo), func(t *testing.T) {
			h, err := NewHasher(KeyConfig{Algo: algo, Seed: "0", BlockSize: 4})
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, uint64(len(algo))))
			prompts := keyCachePrompts(r, 40, 24, 4)
			// Small enough to evict: correctness must not depend on hits.
			c := NewKeyCache(h, 64)
			for round := 0; round < 3; round++ {
				for i, p := range prompts {
					want := h.Keys(nil, p, RequestExtras{})
					if got := c.Keys(nil, p, RequestExtras{}); !slices.Equal(got, want) {
						t.Fatalf("round %d prompt %d: cache %v, hasher %v", round, i, got, want)
					}
				}
			}
			st := c.Stats()
			if st.Hits == 0 || st.Misses == 0 || st.Evictions == 0 {
				t.Fatalf("stats %+v: want hits, misses and evictions", st)
			}
		})
	}
}

func TestKeyCacheTokensAndParentVerified(t *testing.T) {
	h, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := NewKeyCache(h, 1<<10)
	// Same last block under different parents, and blocks differing in one
	// token: each must get its own digest.
	for _, p := range [][]uint32{{1, 2, 3, 4}, {9, 2, 3, 4}, {1, 2, 3, 5}, {3, 4}, {1, 2, 3, 4}} {
		want := h.Keys(nil, p, RequestExtras{})
		if got := c.Keys(nil, p, RequestExtras{}); !slices.Equal(got, want) {
			t.Fatalf("%v: cache %v, hasher %v", p, got, want)
		}
	}
	if st := c.Stats(); st.Hits != 3 || st.Misses != 6 {
		t.Fatalf("stats %+v: want 3 hits (a shared first block, the repeated prompt), 6 misses", st)
	}
}

func TestKeyCacheExtrasBypass(t *testing.T) {
	h, err := NewHasher(KeyConfig{Algo: AlgoSHA256CBOR, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	c := NewKeyCache(h, 1<<10)
	p := randTokens(rand.New(rand.NewPCG(2, 2)), 64)
	plain := c.Keys(nil, p, RequestExtras{})
	for _, x := range []RequestExtras{{LoraName: "a"}, {CacheSalt: "s"}} {
		want := h.Keys(nil, p, x)
		if got := c.Keys(nil, p, x); !slices.Equal(got, want) || slices.Equal(got, plain) {
			t.Fatalf("%+v: cache %v, hasher %v, plain %v", x, got, want, plain)
		}
	}
	if st := c.Stats(); st.Hits != 0 || st.Misses != 16 {
		t.Fatalf("stats %+v: requests with extras must not touch the cache", st)
	}
}

func TestKeyCacheConcurrent(t *testing.T) {
	h, err := NewHasher(KeyConfig{Algo: AlgoXXHash, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	prompts := keyCachePrompts(rand.New(rand.NewPCG(3, 3)), 16, 32, 4)
	want := make([][]Key, len(prompts))
	for i, p := range prompts {
		want[i] = h.Keys(nil, p, RequestExtras{})
	}
	c := NewKeyCache(h, 128)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []Key
			for n := 0; n < 50; n++ {
				i := (g*7 + n) % len(prompts)
				if dst = c.Keys(dst[:0], prompts[i], RequestExtras{}); !slices.Equal(dst, want[i]) {
					errs <- "concurrent lookup returned wrong keys"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// Storing a block the cache already holds is not an eviction: when two
// Keys calls miss the same block at once, both hash it and both put it, and
// the second must leave the entry and the eviction count alone. A different
// block under the same tag (a tag collision: other tokens, or the same
// tokens under another parent) does replace, and so evict, the entry.
func TestKeyCachePutSameBlockIsNoEviction(t *testing.T) {
	h, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	c := NewKeyCache(h, 1<<10)
	blk, other := []uint32{1, 2, 3, 4}, []uint32{5, 6, 7, 8}
	tag := blockTag(0, blk) // both blocks are stored under this one tag
	parent, otherParent := h.none, [32]byte{9}
	d1, d2, d3 := [32]byte{1}, [32]byte{2}, [32]byte{3}
	found := func(p *[32]byte, b []uint32, want [32]byte) bool {
		var got [32]byte
		return c.get(tag, p, b, &got) && got == want
	}
	if c.put(tag, &parent, blk, &d1) {
		t.Fatal("storing into an empty cache evicted")
	}
	if c.put(tag, &parent, blk, &d1) {
		t.Fatal("storing the block the cache holds counted as an eviction")
	}
	if !found(&parent, blk, d1) {
		t.Fatal("the stored block is not found")
	}
	if !c.put(tag, &parent, other, &d2) || found(&parent, blk, d1) || !found(&parent, other, d2) {
		t.Fatal("other tokens under the same tag did not replace the entry as an eviction")
	}
	if !c.put(tag, &otherParent, other, &d3) || found(&parent, other, d2) || !found(&otherParent, other, d3) {
		t.Fatal("another parent under the same tag did not replace the entry as an eviction")
	}
}

func TestKeyCacheWarmDoesNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	h, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	c := NewKeyCache(h, DefaultKeyCacheSize)
	p := randTokens(rand.New(rand.NewPCG(4, 4)), 8192)
	dst := c.Keys(nil, p, RequestExtras{})
	if n := testing.AllocsPerRun(50, func() { dst = c.Keys(dst[:0], p, RequestExtras{}) }); n != 0 {
		t.Fatalf("warm Keys allocated %v times per call", n)
	}
}

// BenchmarkKeyCache512 is the request path's hashing of an 8k-token prompt
// (512 blocks of 16, sha256): cold = every block misses (a new prompt each
// call), warm = the prompt was seen before. Hasher = no cache.
func BenchmarkKeyCache512(b *testing.B) {
	h, err := NewHasher(KeyConfig{Algo: AlgoSHA256, Seed: "0", BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 5))
	p := randTokens(r, 8192)
	dst := make([]Key, 0, 512)
	b.Run("hasher", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			dst = h.Keys(dst[:0], p, RequestExtras{})
		}
	})
	b.Run("cold", func(b *testing.B) {
		c := NewKeyCache(h, DefaultKeyCacheSize)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			p[0] = uint32(i) // a new first block changes every key of the prompt
			dst = c.Keys(dst[:0], p, RequestExtras{})
		}
	})
	// warm16: the load generator's shape, 16 different 8k-token prompts in
	// rotation (8192 cached blocks, ~2.5 MB: past the core's private caches).
	b.Run("warm16", func(b *testing.B) {
		c := NewKeyCache(h, DefaultKeyCacheSize)
		prompts := make([][]uint32, 16)
		for i := range prompts {
			prompts[i] = randTokens(r, 8192)
			dst = c.Keys(dst[:0], prompts[i], RequestExtras{})
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			dst = c.Keys(dst[:0], prompts[i%len(prompts)], RequestExtras{})
		}
		// A 4-way table holding 1/8 of its capacity still has a few
		// overfull sets; anything more means the tags cluster.
		if st := c.Stats(); st.Misses > 16*512+st.Hits/100 {
			b.Fatalf("stats %+v: over 1%% misses while warm", st)
		}
	})
	b.Run("warm", func(b *testing.B) {
		c := NewKeyCache(h, DefaultKeyCacheSize)
		dst = c.Keys(dst[:0], p, RequestExtras{})
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			dst = c.Keys(dst[:0], p, RequestExtras{})
		}
	})
}
