package blockkeys

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// This file reproduces cbor2.dumps(x, canonical=True) for block-hash inputs,
// which vLLM's "sha256_cbor" and "xxhash_cbor" algorithms hash
// (vllm/utils/hashing.py). For the types involved canonical CBOR is simply
// "shortest form everywhere": ints and lengths use the smallest head
// (RFC 8949 §4.2.1), tuples are definite-length arrays, bytes are major type 2,
// str major type 3, None is 0xf6. fxamacker/cbor could produce the same bytes
// but would need an interface-boxed value per block (allocations on the hot
// path), so the few heads we need are written by hand and pinned by vectors.

const (
	cborUint  = 0 << 5
	cborNeg   = 1 << 5
	cborBytes = 2 << 5
	cborText  = 3 << 5
	cborArray = 4 << 5
	cborFalse = 0xf4
	cborTrue  = 0xf5
	cborNull  = 0xf6
)

// cborHead appends a CBOR head (major type | shortest argument encoding).
func cborHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return append(b, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		b = append(b, major|27)
		return binary.BigEndian.AppendUint64(b, v)
	}
}

func cborInt(b []byte, v int64) []byte {
	if v >= 0 {
		return cborHead(b, cborUint, uint64(v))
	}
	return cborHead(b, cborNeg, uint64(-1-v))
}

func cborValue(b []byte, v any, depth int) ([]byte, error) {
	if i, u, unsigned, ok := intValue(v); ok {
		if unsigned {
			return cborHead(b, cborUint, u), nil
		}
		return cborInt(b, i), nil
	}
	switch x := v.(type) {
	case nil:
		return append(b, cborNull), nil
	case string:
		return append(cborHead(b, cborText, uint64(len(x))), x...), nil
	case []byte:
		return append(cborHead(b, cborBytes, uint64(len(x))), x...), nil
	case bool:
		if x {
			return append(b, cborTrue), nil
		}
		return append(b, cborFalse), nil
	case []any:
		if depth >= pkMaxDepth {
			return b, fmt.Errorf("extra keys nested deeper than %d", pkMaxDepth)
		}
		b = cborHead(b, cborArray, uint64(len(x)))
		var err error
		for _, e := range x {
			if b, err = cborValue(b, e, depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	default:
		return b, fmt.Errorf("%w: %T", errUnsupportedExtra, v)
	}
}

// appendCBORBlock appends cbor2.dumps((parent, tuple(tokens), extra), canonical=True).
func appendCBORBlock(buf []byte, parent []byte, tokens []uint32, extraKeys *ExtraKeys) ([]byte, error) {
	b := append(buf, cborArray|3)
	b = cborHead(b, cborBytes, uint64(len(parent)))
	b = append(b, parent...)
	b = cborHead(b, cborArray, uint64(len(tokens)))
	// Write by index into pre-grown space: this loop is most of the cost
	// not spent in the digest.
	b = slices.Grow(b, 5*len(tokens)+1)
	n := len(b)
	b = b[:n+5*len(tokens)]
	for _, t := range tokens {
		switch {
		case t < 24:
			b[n] = byte(t)
			n++
		case t <= 0xff:
			b[n], b[n+1] = 24, byte(t)
			n += 2
		case t <= 0xffff:
			b[n] = 25
			binary.BigEndian.PutUint16(b[n+1:], uint16(t))
			n += 3
		default:
			b[n] = 26
			binary.BigEndian.PutUint32(b[n+1:], t)
			n += 5
		}
	}
	return extraKeys.cbor(b[:n])
}

// appendCBORString appends cbor2.dumps(s, canonical=True): the NONE_HASH input.
func appendCBORString(buf []byte, s string) []byte {
	return append(cborHead(buf, cborText, uint64(len(s))), s...)
}
