package blockkeys

import "strings"

// Engine is the kind of engine publishing a stream. Everything that differs
// between engines is a property in the Engines table, never a comparison
// with one engine's value, so adding an engine is adding a row: no code
// path can fold a third engine into one of the others.
type Engine uint8

const (
	EngineVLLM Engine = iota
	EngineSGLang
	// EngineTRTLLM is TensorRT-LLM's KV-cache-manager-V2 ZMQ publisher
	// (tensorrt_llm/_torch/pyexecutor/kv_cache_events.py).
	EngineTRTLLM
	// EngineSGLangEAGLE is SGLang with EAGLE speculative decoding: its radix
	// tree and its events key every position by the pair [t_i, t_i+1]
	// (mem_cache/utils.py convert_to_bigram_key), so page k hashes the pairs
	// of positions kP..kP+P-1 and a prompt of n tokens has floor((n-1)/P)
	// full pages. An SGLang stream that publishes pairs is scored under this
	// row's keys (the applier sets its bit); it may also be configured.
	EngineSGLangEAGLE
	// NumEngines sizes per-engine tables.
	NumEngines
)

// HashScheme is how an engine derives its block hashes from token ids.
type HashScheme uint8

const (
	// SchemeVLLM: H((parent, tuple(tokens), extra_keys)) serialised with
	// pickle, CBOR or msgpack and hashed with SHA-256 or xxh3_128, as
	// --prefix-caching-hash-algo says; the root parent is NONE_HASH = H(seed).
	SchemeVLLM HashScheme = iota
	// SchemeSGLang: SHA-256(parent digest ‖ each token as uint32 LE), the
	// first page of a chain with no parent bytes at all (SGLang's
	// get_hash_str / hash_page).
	SchemeSGLang
	// SchemeTRTLLM: SHA-256(parent key ‖ each token as uint32 LE), the first
	// block's parent being the root key SHA-256(ReuseScope bytes): a mask
	// byte (bit 0 LoRA task id, bit 1 cache salt) then each present value as
	// uint64 LE (TensorRT-LLM's _block_radix_tree.py Hasher, RootBlock).
	SchemeTRTLLM
)

// EngineInfo is one engine's row.
type EngineInfo struct {
	// Name is the engine's name in configuration, metrics and the API.
	Name string
	// Scheme is how its block hashes are computed (see HashScheme).
	Scheme HashScheme
	// HeadKey: the engine's 64-bit hash is the FIRST 8 bytes of its digest,
	// big-endian (as a signed int64 on the wire: the same 64 bits). Else it
	// is the last 8 (vLLM's int.from_bytes(digest, "big") & (2**64-1)). It
	// also says how a digest sent as bytes is reduced to 64 bits.
	HeadKey bool
	// CountsCopies: the engine may announce one hash once per physical GPU
	// block (vLLM's block pool), so a second store is a second copy and a
	// removal of one copy must not unindex the block.
	CountsCopies bool
	// Pairs: pages hash token pairs [t_i, t_i+1], each as two uint32 LE
	// (SGLang's get_hash_str on bigram keys), not single tokens.
	Pairs bool
}

// Engines is the engine table, indexed by Engine.
var Engines = [NumEngines]EngineInfo{
	EngineVLLM:        {Name: "vllm", Scheme: SchemeVLLM, CountsCopies: true},
	EngineSGLang:      {Name: "sglang", Scheme: SchemeSGLang, HeadKey: true},
	EngineTRTLLM:      {Name: "trtllm", Scheme: SchemeTRTLLM, HeadKey: true},
	EngineSGLangEAGLE: {Name: "sglang-eagle", Scheme: SchemeSGLang, HeadKey: true, Pairs: true},
}

// Info returns e's row; an out-of-range value gets vLLM's (the default
// engine), which ParseEngine never produces.
func (e Engine) Info() *EngineInfo {
	if e < NumEngines {
		return &Engines[e]
	}
	return &Engines[EngineVLLM]
}

func (e Engine) String() string {
	if e < NumEngines {
		return Engines[e].Name
	}
	return "unknown"
}

// Valid reports whether e is a row of the table.
func (e Engine) Valid() bool { return e < NumEngines }

// ParseEngine accepts an engine's Name (case-insensitive); "" is vLLM.
func ParseEngine(s string) (Engine, bool) {
	if s == "" {
		return EngineVLLM, true
	}
	for i := range Engines {
		if strings.EqualFold(s, Engines[i].Name) {
			return Engine(i), true
		}
	}
	return 0, false
}

// EngineNames lists the engines for messages: "vllm, sglang, ...".
func EngineNames() string {
	names := make([]string, len(Engines))
	for i := range Engines {
		names[i] = Engines[i].Name
	}
	return strings.Join(names, ", ")
}
