package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/blockkeys"
)

// Block hashes and token ids as the engines send them.

// Events of at most smallHashes hashes take theirs from the message's
// arena, allocated hashArenaChunk hashes (512 bytes) at a time; larger ones
// get a slice of their own, of exactly their size.
const (
	smallHashes    = 8
	hashArenaChunk = 64
)

func decodeHashes(r *reader, engine blockkeys.Engine) ([]uint64, error) {
	if r.nextNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	var out []uint64
	if n > smallHashes {
		out = make([]uint64, n)
	} else {
		// A few hashes (an eviction sweep publishes one BlockRemoved per
		// block) share a chunk of the message's arena: one allocation per
		// hashArenaChunk of them instead of one per event.
		if cap(r.hashes)-len(r.hashes) < n {
			r.hashes = make([]uint64, 0, hashArenaChunk)
		}
		start := len(r.hashes)
		r.hashes = r.hashes[:start+n]
		out = r.hashes[start : start+n : start+n]
	}
	b := r.b
	for i := range out {
		// Fast path: vLLM's default hashes are mostly 9-byte uint64s.
		if p := r.p; p+9 <= len(b) && b[p] == 0xcf {
			out[i] = binary.BigEndian.Uint64(b[p+1:])
			r.p += 9
			continue
		}
		if out[i], err = decodeHash(r, engine); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

// decodeHash normalises one block hash to uint64:
//   - any msgpack integer, any width or sign: its two's complement 64 bits.
//     That is vLLM's default (the last 8 digest bytes as an unsigned int),
//     SGLang's signed int64 (first 8 digest bytes) and old Python hash()
//     values alike.
//   - bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 16, 32 or 64
//     byte digests): see normaliseHashBytes.
func decodeHash(r *reader, engine blockkeys.Engine) (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if isIntCode(c) {
		v, _, err := r.intBits()
		return v, err
	}
	if isBinCode(c) || isStrCode(c) {
		b, err := r.strOrBin()
		if err != nil {
			return 0, err
		}
		return normaliseHashBytes(b, engine)
	}
	return 0, &typeError{"hash (int or bytes)", c}
}

// normaliseHashBytes reduces a digest to the 64 bits that engine would have
// sent as an integer: vLLM's int form is the LAST 8 bytes big-endian, SGLang's
// the FIRST 8 bytes (blockkeys.EngineInfo.HeadKey). Shorter values are read as
// one big-endian integer.
func normaliseHashBytes(b []byte, engine blockkeys.Engine) (uint64, error) {
	if len(b) == 0 {
		return 0, errors.New("empty hash bytes")
	}
	if len(b) > 8 {
		if engine.Info().HeadKey {
			b = b[:8]
		} else {
			b = b[len(b)-8:]
		}
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v, nil
}

// decodeTokens reads token_ids. SGLang with EAGLE speculative decoding keys
// its radix tree by bigrams and publishes each position as a pair [t_i,
// t_i+1] (mem_cache/utils.py convert_to_bigram_key), hashing both tokens of
// every pair. Both are kept: a pair event's out is the pairs flattened, two
// ids per position (bigram reports it), which is exactly the byte sequence
// SGLang hashes. An array holding both pairs and plain ids is an error.
func decodeTokens(r *reader) (out []uint32, bigram bool, err error) {
	if r.nextNil() {
		return nil, false, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, false, err
	}
	if n > 0 {
		if c, err := r.peek(); err == nil && isArrayCode(c) {
			out, err = tokenPairs(r, n)
			return out, true, err
		}
	}
	out = make([]uint32, n)
	b := r.b
	for i := range out {
		// Fast paths for the encodings token ids actually use.
		if p := r.p; p < len(b) {
			switch c := b[p]; {
			case c <= 0x7f:
				out[i] = uint32(c)
				r.p++
				continue
			case c == 0xcd && p+3 <= len(b):
				out[i] = uint32(binary.BigEndian.Uint16(b[p+1:]))
				r.p += 3
				continue
			case c == 0xce && p+5 <= len(b):
				out[i] = binary.BigEndian.Uint32(b[p+1:])
				r.p += 5
				continue
			case isArrayCode(c):
				return nil, false, fmt.Errorf("[%d]: a token pair among plain token ids", i)
			}
		}
		if out[i], err = tokenID(r); err != nil {
			return nil, false, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, false, nil
}

// tokenPairs reads n EAGLE bigrams [t_i, t_i+1] into 2n ids.
func tokenPairs(r *reader, n int) ([]uint32, error) {
	out := make([]uint32, 2*n)
	for i := 0; i < n; i++ {
		m, err := r.arrayLen()
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		if m != 2 {
			return nil, fmt.Errorf("[%d]: token pair has %d elements", i, m)
		}
		for j := 0; j < 2; j++ {
			if out[2*i+j], err = tokenID(r); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
	}
	return out, nil
}

func tokenID(r *reader) (uint32, error) {
	v, neg, err := r.intBits()
	if err != nil {
		return 0, err
	}
	if neg || v > math.MaxUint32 {
		return 0, fmt.Errorf("token id %d out of range", int64(v))
	}
	return uint32(v), nil
}
