package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/blockkeys"
)

// Block hashes and token ids as the engines send them.

func decodeHashes(r *reader, engine blockkeys.Engine) ([]uint64, error) {
	if r.nextNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
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
// t_i+1]: the first token is the token at that position, the second its
// successor. The first is kept (bigram reports that pairs were seen).
func decodeTokens(r *reader) (out []uint32, bigram bool, err error) {
	if r.nextNil() {
		return nil, false, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, false, err
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
				if out[i], err = tokenPair(r); err != nil {
					return nil, false, fmt.Errorf("[%d]: %w", i, err)
				}
				bigram = true
				continue
			}
		}
		if out[i], err = tokenID(r); err != nil {
			return nil, false, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, bigram, nil
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

// tokenPair reads an EAGLE bigram [t_i, t_i+1] and returns t_i.
func tokenPair(r *reader) (uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return 0, err
	}
	if n != 2 {
		return 0, fmt.Errorf("token pair has %d elements", n)
	}
	t, err := tokenID(r)
	if err != nil {
		return 0, err
	}
	_, err = tokenID(r)
	return t, err
}
