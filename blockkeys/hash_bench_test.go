package blockkeys

import "testing"

// BenchmarkBlockKeys reports the cost of one 16-token block key (ns/op is per
// block): 64 blocks per call, realistic ids (> 2^16), no extra keys.
func BenchmarkBlockKeys(b *testing.B) {
	const blocks = 64
	toks := make([]uint32, 16*blocks)
	for i := range toks {
		toks[i] = uint32(i*7919) % 151936
	}
	for _, a := range HashAlgos {
		h, _ := NewHasher(KeyConfig{Algo: a, Seed: "0", BlockSize: 16})
		dst := make([]Key, 0, blocks)
		b.Run(string(a), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i += blocks {
				dst = h.Keys(dst[:0], toks, RequestExtras{})
			}
		})
	}
	// The other engines' SHA-256 page keys; sglang-eagle hashes 32 ids
	// (16 pairs) per page.
	set, _ := NewHasherSet(KeyConfig{Algo: AlgoSHA256, BlockSize: 16}, nil)
	for e := EngineSGLang; e < NumEngines; e++ {
		h := set.ForEngine("m", e)
		dst := make([]Key, 0, blocks)
		b.Run(e.String(), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i += blocks {
				dst = h.Keys(dst[:0], toks, RequestExtras{})
			}
		})
	}
}

// BenchmarkBlockSerialize isolates our share of BenchmarkBlockKeys: building
// one 16-token block's pickle / CBOR / msgpack input, without the digest.
func BenchmarkBlockSerialize(b *testing.B) {
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(i*7919) % 151936
	}
	parent := make([]byte, 32)
	var extraKeys ExtraKeys
	buf := make([]byte, 0, 256)
	b.Run("pickle", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf, _ = appendPickleBlock(buf[:0], parent, toks, &extraKeys)
		}
	})
	b.Run("cbor", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf, _ = appendCBORBlock(buf[:0], parent, toks, &extraKeys)
		}
	})
	b.Run("msgpack", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf, _ = appendMsgpackBlock(buf[:0], parent, toks, &extraKeys)
		}
	})
}
