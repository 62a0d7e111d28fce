// Package blockkeys computes engine-exact block keys: the 64-bit key of each
// block of a token sequence, equal to the hash the engine itself publishes
// for that block, so that a key computed from a router's prompt and a hash
// from an engine's event compare directly.
//
// It owns the key configuration (algorithm, seed, block size), the hash
// algorithms and their encoders (CPython pickle, CBOR as cbor2 writes it,
// msgspec's msgpack), the extra keys a block is hashed with (LoRA, cache
// salt, an engine's own tuple), the engine table (vLLM, SGLang,
// TensorRT-LLM: how each hashes), hashers per model and a bounded key cache
// for prompts whose prefixes repeat.
//
// It does not own what an engine says about its cache (package
// kvevents/event), how events reach an index (package applier) or the index
// itself (package kvindex). Every rule here is pinned by golden vectors that
// a reference we did not write produced (testdata/, hack/gen_*_vectors.py).
package blockkeys
