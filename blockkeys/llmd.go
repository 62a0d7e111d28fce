package blockkeys

import "hash/fnv"

// llm-d's own block hashes (llm-d/llm-d-kv-cache pkg/kvcache/kvblock/
// token_processor.go, chunkedTokenDatabase.hash; llm-d-inference-sim
// publishes them): FNV-64a over the canonical CBOR of [parent, tokens,
// extra], parent a uint64, tokens an array of uints, extra nil for a text
// request. A chain's root parent is hash(FNV-64a(seed bytes), nil, model
// name): unlike vLLM's, these hashes depend on the model's name and on no
// algorithm choice. kvindex does not key pods by them (a pod publishing them
// is indexed under kvindex's keys after the parity check); the parity hint
// recognises them so it can say the hash function differs, not the seed.

// LLMDRoot is llm-d's root parent for a model and seed.
func LLMDRoot(seed, model string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(seed))
	b := cborHead([]byte{cborArray | 3}, cborUint, h.Sum64())
	b = append(b, cborNull)
	b = append(cborHead(b, cborText, uint64(len(model))), model...)
	return fnv64a(b)
}

// LLMDBlockHash is llm-d's hash of one text block after parent.
func LLMDBlockHash(parent uint64, tokens []uint32) uint64 {
	b := cborHead([]byte{cborArray | 3}, cborUint, parent)
	b = cborHead(b, cborArray, uint64(len(tokens)))
	for _, t := range tokens {
		b = cborHead(b, cborUint, uint64(t))
	}
	return fnv64a(append(b, cborNull))
}

func fnv64a(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}
