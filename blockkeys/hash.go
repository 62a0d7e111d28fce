package blockkeys

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/internal/tenant"
)

// HashAlgo names vLLM's --prefix-caching-hash-algo choices.
type HashAlgo string

const (
	AlgoSHA256        HashAlgo = "sha256"         // pickle protocol 5 + SHA-256 (vLLM default since v0.10.2)
	AlgoSHA256CBOR    HashAlgo = "sha256_cbor"    // canonical CBOR + SHA-256
	AlgoSHA256Msgpack HashAlgo = "sha256_msgpack" // msgspec msgpack + SHA-256
	AlgoXXHash        HashAlgo = "xxhash"         // pickle protocol 5 + xxh3_128
	AlgoXXHashCBOR    HashAlgo = "xxhash_cbor"    // canonical CBOR + xxh3_128
	AlgoXXHashMsgpack HashAlgo = "xxhash_msgpack" // msgspec msgpack + xxh3_128
)

// DefaultSeed is the seed vLLM derives NONE_HASH from when PYTHONHASHSEED is
// unset and the algorithm is cryptographic (the sha256 family):
// DEFAULT_NONE_HASH_SEED in vllm/v1/core/kv_cache_utils.py,
// resolve_none_hash_seed, since vllm-project/vllm PR #51875 (merged
// 2026-08-11). Before it, and still for the xxhash family (RandomSeed), an
// unset PYTHONHASHSEED meant random bytes: those engines must set it, and
// kvindexd's seed must equal it. It is kvindexd's default seed, so a current
// vLLM with its default algorithm matches out of the box.
const DefaultSeed = "vllm-none-hash"

// RandomSeed reports whether vLLM seeds algorithm a with random bytes when
// PYTHONHASHSEED is unset: the non-cryptographic xxhash family
// (_NON_CRYPTO_HASH_FUNCTIONS; xxhash_msgpack is counted with them, its
// digest being as weak). Such engines match only with PYTHONHASHSEED set.
func (a HashAlgo) RandomSeed() bool {
	return a == AlgoXXHash || a == AlgoXXHashCBOR || a == AlgoXXHashMsgpack
}

// HashAlgos lists every supported algorithm.
var HashAlgos = []HashAlgo{AlgoSHA256, AlgoSHA256CBOR, AlgoSHA256Msgpack, AlgoXXHash, AlgoXXHashCBOR, AlgoXXHashMsgpack}

// HashAlgoNames is HashAlgos for messages: "sha256, sha256_cbor, ...".
func HashAlgoNames() string {
	names := make([]string, len(HashAlgos))
	for i, a := range HashAlgos {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// ParseHashAlgo accepts the names vLLM accepts (case-insensitive).
func ParseHashAlgo(s string) (HashAlgo, error) {
	for _, a := range HashAlgos {
		if strings.EqualFold(s, string(a)) {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown hash algorithm %q (want one of %s)", s, HashAlgoNames())
}

// serialisation is how an algorithm turns the block tuple into bytes.
type serialisation uint8

const (
	serPickle serialisation = iota
	serCBOR
	serMsgpack
)

// MaxBlockSize bounds KeyConfig.BlockSize; it only guards against nonsense.
const MaxBlockSize = 1 << 20

// KeyConfig is what must equal the engine's settings for our keys to equal its
// block hashes: --prefix-caching-hash-algo, PYTHONHASHSEED and --block-size.
type KeyConfig struct {
	Algo      HashAlgo
	Seed      string // the engine's PYTHONHASHSEED string; vLLM hashes it as a str
	BlockSize int
}

func (c KeyConfig) String() string {
	return fmt.Sprintf("algo=%s seed=%q block_size=%d", c.Algo, c.Seed, c.BlockSize)
}

// Hasher computes one engine's block hashes for one KeyConfig: vLLM's
// (NewHasher) or another engine's (NewEngineHasher). It is immutable after
// construction and safe for concurrent use.
type Hasher struct {
	cfg    KeyConfig
	engine Engine
	scheme HashScheme
	ser    serialisation
	xxh    bool // digest: xxh3_128 (true) or SHA-256
	dlen   int  // digest length: 32 (SHA-256) or 16 (xxh3_128)
	head   bool // the key is the first 8 digest bytes (else the last 8)
	pairs  bool // pages hash token pairs (EngineInfo.Pairs)
	// rootLen is how many bytes of none a chain's first block hashes as its
	// parent: dlen for vLLM (NONE_HASH), 0 for SGLang (no parent bytes).
	rootLen int
	none    [32]byte
}

// NewHasher validates cfg and precomputes NONE_HASH = H(seed as a str), the
// parent of every request's first block (vllm/v1/core/kv_cache_utils.py
// init_none_hash). An engine without PYTHONHASHSEED hashes DefaultSeed (the
// sha256 family, vLLM since PR #51875) or random bytes (the xxhash family,
// and every algorithm before that PR), which no one can reproduce.
func NewHasher(cfg KeyConfig) (*Hasher, error) {
	algo, err := ParseHashAlgo(string(cfg.Algo))
	if err != nil {
		return nil, err
	}
	if cfg.BlockSize < 1 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("block size %d out of range [1, %d]", cfg.BlockSize, MaxBlockSize)
	}
	cfg.Algo = algo
	h := &Hasher{cfg: cfg}
	switch algo {
	case AlgoSHA256:
	case AlgoSHA256CBOR:
		h.ser = serCBOR
	case AlgoSHA256Msgpack:
		h.ser = serMsgpack
	case AlgoXXHash:
		h.xxh = true
	case AlgoXXHashCBOR:
		h.ser, h.xxh = serCBOR, true
	case AlgoXXHashMsgpack:
		h.ser, h.xxh = serMsgpack, true
	}
	h.dlen = 32
	if h.xxh {
		h.dlen = 16
	}
	var in []byte
	switch h.ser {
	case serCBOR:
		in = appendCBORString(nil, cfg.Seed)
	case serMsgpack:
		if in, err = appendMsgpackString(nil, cfg.Seed); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
	default:
		in = appendPickleString(nil, cfg.Seed)
	}
	h.none = h.sum(in)
	h.rootLen = h.dlen
	return h, nil
}

// NewEngineHasher returns engine's Hasher for cfg: vLLM's is NewHasher(cfg);
// for the others only cfg.BlockSize applies (their hashing has no algorithm
// choice and no seed).
func NewEngineHasher(engine Engine, cfg KeyConfig) (*Hasher, error) {
	info := engine.Info()
	if info.Scheme == SchemeVLLM {
		return NewHasher(cfg)
	}
	if cfg.BlockSize < 1 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("block size %d out of range [1, %d]", cfg.BlockSize, MaxBlockSize)
	}
	h := &Hasher{cfg: cfg, engine: engine, scheme: info.Scheme, dlen: 32, head: info.HeadKey, pairs: info.Pairs}
	if info.Scheme == SchemeTRTLLM {
		h.none, h.rootLen = trtRoot(RequestExtras{}), 32
	}
	return h, nil
}

// trtRoot is TensorRT-LLM's root key for a request: SHA-256 of its
// ReuseScope bytes. A LoRA enters as its numeric task id, which a router
// does not know by name: requests naming a LoRA are not hashed for
// TensorRT-LLM (Hasher.Keys returns no keys), so they never match base-model
// blocks.
func trtRoot(x RequestExtras) [32]byte {
	var b [9]byte
	n := 1
	if x.CacheSalt != "" {
		b[0] |= 2
		binary.LittleEndian.PutUint64(b[1:], TRTSaltID(x.CacheSalt))
		n = 9
	}
	return sha256.Sum256(b[:n])
}

// TRTSaltID is TensorRT-LLM's cache-salt id: the first 8 bytes of
// BLAKE3(UTF-8 salt) read little-endian (tensorrt_llm/runtime/
// kv_cache_hash.py get_cache_salt_id, used by request handling and by its
// cache-aware router, which builds ReuseScope(salt=id)). BLAKE3's 8-byte
// output is the prefix of its 32-byte digest.
func TRTSaltID(salt string) uint64 {
	d := blake3.Sum256([]byte(salt))
	return binary.LittleEndian.Uint64(d[:8])
}

// Engine is the engine whose hashes h computes.
func (h *Hasher) Engine() Engine { return h.engine }

// Root is the parent digest of a chain's first block and how many of its
// bytes are hashed.
func (h *Hasher) Root() ([32]byte, int) { return h.none, h.rootLen }

// Config returns the (normalised) configuration.
func (h *Hasher) Config() KeyConfig { return h.cfg }

// NoneHash returns NONE_HASH, the parent digest of a request's first block.
func (h *Hasher) NoneHash() []byte { return append([]byte(nil), h.none[:h.dlen]...) }

// DigestLen is the length of this algorithm's digests (32 or 16).
func (h *Hasher) DigestLen() int { return h.dlen }

func (h *Hasher) sum(in []byte) (d [32]byte) {
	if h.xxh {
		v := xxh3.Hash128(in)
		binary.BigEndian.PutUint64(d[0:], v.Hi) // xxh3_128_digest: canonical big-endian
		binary.BigEndian.PutUint64(d[8:], v.Lo)
		return d
	}
	return sha256.Sum256(in)
}

// keyOf is vLLM's wire form: int.from_bytes(digest, "big") & (2**64-1).
func keyOf(d *[32]byte, dlen int) Key {
	return Key(binary.BigEndian.Uint64(d[dlen-8 : dlen]))
}

// DigestKey is h's engine's 64-bit form of digest d: the last 8 bytes (vLLM) or
// the first 8 (SGLang's hash_str_to_int64, a signed int64 of the same bits).
func (h *Hasher) DigestKey(d *[32]byte) Key {
	if h.head {
		return Key(binary.BigEndian.Uint64(d[:8]))
	}
	return keyOf(d, h.dlen)
}

// ExtraKeys is one block's extra-keys tuple without boxing the common cases:
// either generic values from an event (exactly as the engine hashed them), or
// up to two strings (LoRA name, cache_salt) in vLLM's order. Empty = None.
// ExtraKeys is the extra-keys tuple one block is hashed with: either a tuple
// exactly as an engine published it (SetTuple) or the one vLLM builds for a
// text request (ForRequest). The zero value is None. It is a value type so
// the hot paths can keep one on the stack and reuse it per block.
type ExtraKeys struct {
	generic []any
	n       int
	s       [2]string
}

// ForRequest builds vLLM's extra keys for a text-only request's block:
// (lora_name,) + (cache_salt,) on the first block only
// (kv_cache_utils.generate_block_hash_extra_keys: lora + mm + salt + embeds;
// an empty salt is falsy there and skipped).
// SetTuple makes e the tuple an engine published for one block; nil or
// empty is None (vLLM never hashes an empty tuple).
func (e *ExtraKeys) SetTuple(t []any) { e.generic, e.n = t, 0 }

func (e *ExtraKeys) ForRequest(x RequestExtras, first bool) {
	e.generic, e.n = nil, 0
	if x.LoraName != "" {
		e.s[e.n] = x.LoraName
		e.n++
	}
	if first && x.CacheSalt != "" {
		e.s[e.n] = x.CacheSalt
		e.n++
	}
}

func (e *ExtraKeys) pickle(p *pickler) error {
	if len(e.generic) > 0 {
		// The tuple is written here rather than via p.value(e.generic): boxing
		// the slice into an interface would allocate per block.
		p.tupleStart(len(e.generic))
		for _, v := range e.generic {
			if err := p.value(v, 1); err != nil {
				return err
			}
		}
		p.tupleEnd(len(e.generic))
		return nil
	}
	if e.n == 0 {
		p.boundary()
		p.op(pkNone)
		return nil
	}
	p.tupleStart(e.n)
	for i := 0; i < e.n; i++ {
		p.blob(e.s[i], nil, true)
	}
	p.tupleEnd(e.n)
	return nil
}

func (e *ExtraKeys) cbor(b []byte) ([]byte, error) {
	if len(e.generic) > 0 {
		b = cborHead(b, cborArray, uint64(len(e.generic)))
		var err error
		for _, v := range e.generic {
			if b, err = cborValue(b, v, 1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	if e.n == 0 {
		return append(b, cborNull), nil
	}
	b = append(b, cborArray|byte(e.n))
	for i := 0; i < e.n; i++ {
		b = append(cborHead(b, cborText, uint64(len(e.s[i]))), e.s[i]...)
	}
	return b, nil
}

// BlockDigest computes H((parent, tuple(tokens), extra)) (kv_cache_utils.hash_block_tokens)
// using buf as scratch; it returns the (possibly grown) buffer for reuse.
func (h *Hasher) BlockDigest(buf []byte, parent []byte, tokens []uint32, extraKeys *ExtraKeys) ([]byte, [32]byte, error) {
	if h.scheme != SchemeVLLM {
		// SGLang and TensorRT-LLM: parent ‖ tokens as uint32 little-endian;
		// no extra keys enter a block (SGLang has none, TensorRT-LLM puts
		// its LoRA and salt in the root). An event that sent per-block
		// extra keys (SGLang's proposed extra_keys, TensorRT-LLM's mm_keys)
		// hashed something else: not reproducible here.
		if len(extraKeys.generic) > 0 {
			return buf, [32]byte{}, errEngineExtraKeys
		}
		buf = append(buf[:0], parent...)
		for _, t := range tokens {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		return buf, sha256.Sum256(buf), nil
	}
	var err error
	switch h.ser {
	case serCBOR:
		buf, err = appendCBORBlock(buf[:0], parent, tokens, extraKeys)
	case serMsgpack:
		buf, err = appendMsgpackBlock(buf[:0], parent, tokens, extraKeys)
	default:
		buf, err = appendPickleBlock(buf[:0], parent, tokens, extraKeys)
	}
	if err != nil {
		return buf, [32]byte{}, err
	}
	return buf, h.sum(buf), nil
}

var errEngineExtraKeys = errors.New("kvindex: per-block extra keys in an engine hash without them")

// RequestExtras are the per-request inputs of vLLM's extra keys that a router
// knows: the LoRA adapter's name (empty = base model) and cache_salt.
type RequestExtras struct {
	LoraName  string
	CacheSalt string
}

// scratchPool holds serialisation buffers. A pool rather than a stack array
// because the (recursive) encoders make escape analysis move any buffer they
// touch to the heap; a pooled buffer costs one Get/Put per call, not per block,
// and keeps whatever capacity large block sizes needed.
var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getScratch() *[]byte { return scratchPool.Get().(*[]byte) }

func putScratch(p *[]byte, b []byte) {
	if cap(b) > 1<<20 { // do not pin buffers of pathological block sizes
		return
	}
	*p = b[:0]
	scratchPool.Put(p)
}

// Keys appends the 64-bit wire keys of every FULL block of tokens to dst.
// Safe for concurrent use. It allocates only when dst must grow.
func (h *Hasher) Keys(dst []Key, tokens []uint32, extras RequestExtras) []Key {
	sp := getScratch()
	buf := *sp
	defer func() { putScratch(sp, buf) }()
	parent, plen := h.Root()
	if h.scheme == SchemeTRTLLM && extras != (RequestExtras{}) {
		if extras.LoraName != "" {
			return dst // see trtRoot
		}
		parent = trtRoot(extras)
	}
	if h.pairs {
		return h.pairKeys(dst, buf, parent, plen, tokens)
	}
	var extraKeys ExtraKeys
	bs := h.cfg.BlockSize
	for i := 0; i+bs <= len(tokens); i += bs {
		extraKeys.ForRequest(extras, i == 0)
		var d [32]byte
		var err error
		// Only msgpack can fail on string extras (4 GiB and longer): vLLM
		// fails to hash such a request too, so it has no cached blocks.
		if buf, d, err = h.BlockDigest(buf, parent[:plen], tokens[i:i+bs], &extraKeys); err != nil {
			break
		}
		dst = append(dst, h.DigestKey(&d))
		parent, plen = d, h.dlen
	}
	return dst
}

// pairKeys is Keys for an engine that hashes token pairs (SGLang with
// EAGLE): page k is SHA-256(page k-1's digest ‖ t_i, t_i+1 as uint32 LE for
// every position i of the page), the first page with no parent bytes; a
// page is full once the token after its last position is known, so n
// tokens make floor((n-1)/P) pages. Extras do not enter SGLang's hash.
func (h *Hasher) pairKeys(dst []Key, buf []byte, parent [32]byte, plen int, tokens []uint32) []Key {
	bs := h.cfg.BlockSize
	for i := 0; i+bs < len(tokens); i += bs {
		buf = append(buf[:0], parent[:plen]...)
		for j := i; j < i+bs; j++ {
			buf = binary.LittleEndian.AppendUint32(buf, tokens[j])
			buf = binary.LittleEndian.AppendUint32(buf, tokens[j+1])
		}
		parent, plen = sha256.Sum256(buf), 32
		dst = append(dst, h.DigestKey(&parent))
	}
	return dst
}

// Pairs reports whether h's engine hashes token pairs (EngineInfo.Pairs).
func (h *Hasher) Pairs() bool { return h.pairs }

// HasherSet is the default KeyConfig plus per-model overrides (fleets where
// models run with different block sizes or algorithms), with each engine's
// Hasher for every config: a model has one block size whatever engine
// serves it. Immutable after construction and safe for concurrent use.
type HasherSet struct {
	def      *Hasher
	perModel map[string]*Hasher
	// engines: for every config's vLLM Hasher, each engine's Hasher with
	// the same block size (engines[h][EngineVLLM] == h).
	engines map[*Hasher]*[NumEngines]*Hasher
}

// NewHasherSet builds one Hasher per distinct config.
func NewHasherSet(def KeyConfig, perModel map[string]KeyConfig) (*HasherSet, error) {
	d, err := NewHasher(def)
	if err != nil {
		return nil, fmt.Errorf("default key config: %w", err)
	}
	s := &HasherSet{def: d, perModel: make(map[string]*Hasher, len(perModel))}
	names := make([]string, 0, len(perModel))
	for m := range perModel {
		names = append(names, m)
	}
	sort.Strings(names) // deterministic first error
	for _, m := range names {
		h, err := NewHasher(perModel[m])
		if err != nil {
			return nil, fmt.Errorf("key config for model %q: %w", m, err)
		}
		s.perModel[m] = h
	}
	s.engines = map[*Hasher]*[NumEngines]*Hasher{}
	for _, h := range append([]*Hasher{d}, mapsValues(s.perModel)...) {
		var row [NumEngines]*Hasher
		for e := range row {
			if Engine(e) == EngineVLLM {
				row[e] = h
				continue
			}
			if row[e], err = NewEngineHasher(Engine(e), h.cfg); err != nil {
				return nil, err
			}
		}
		s.engines[h] = &row
	}
	return s, nil
}

func mapsValues(m map[string]*Hasher) []*Hasher {
	out := make([]*Hasher, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	return out
}

// ForEngine returns the model's Hasher for engine: its keys are the hashes
// that engine publishes for the model's blocks.
func (s *HasherSet) ForEngine(model string, engine Engine) *Hasher {
	h := s.For(model)
	if engine == EngineVLLM || !engine.Valid() {
		return h
	}
	return s.engines[h][engine]
}

// For returns the model's Hasher, or the default one. A tenant's model
// (tenant.Model) hashes as the model itself: the engines publish the same
// hashes whoever the tenant.
func (s *HasherSet) For(model string) *Hasher {
	if h, ok := s.perModel[model]; ok {
		return h
	}
	if len(s.perModel) > 0 {
		if base := tenant.Base(model); len(base) != len(model) {
			if h, ok := s.perModel[base]; ok {
				return h
			}
		}
	}
	return s.def
}

// Default returns the default Hasher.
func (s *HasherSet) Default() *Hasher { return s.def }
