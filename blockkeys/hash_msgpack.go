package blockkeys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// This file reproduces msgspec.msgpack.Encoder().encode(x) for block-hash
// inputs, which vLLM's "sha256_msgpack" and "xxhash_msgpack" algorithms hash
// (vllm/utils/hashing.py). For the types involved msgspec writes the shortest
// form everywhere, exactly as the msgpack reference library does with its
// defaults: ints as positive/negative fixint or the narrowest
// uint8..uint64 / int8..int64, str as fixstr/str8/str16/str32, bytes as
// bin8/bin16/bin32, tuples and lists alike as fixarray/array16/array32, None
// as nil. vLLM passes the block's token ids as they are (no tuple copy), which
// changes nothing here: a list is an array too. Lengths of 2^32 and more are
// an error in msgspec, so they are one here.

const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixStr   = 0xa0
	mpStr8     = 0xd9
	mpFixArray = 0x90
	mpArray16  = 0xdc
)

var errMsgpackTooLong = errors.New("msgpack cannot encode a length of 2^32 or more")

// mpKind selects one family of length heads.
type mpKind uint8

const (
	mpStr mpKind = iota
	mpBin
	mpArray
)

// msgpackHead appends the shortest head for a str, bin or array of n items.
func msgpackHead(b []byte, kind mpKind, n int) ([]byte, error) {
	u := uint64(n)
	switch {
	case kind == mpStr && u < 32:
		return append(b, mpFixStr|byte(u)), nil
	case kind == mpArray && u < 16:
		return append(b, mpFixArray|byte(u)), nil
	case u > 0xffffffff:
		return b, errMsgpackTooLong
	}
	// str8/16/32 = d9..db, bin8/16/32 = c4..c6, array16/32 = dc..dd
	var op byte
	switch kind {
	case mpStr:
		op = mpStr8
	case mpBin:
		op = mpBin8
	default:
		op = mpArray16 - 1 // arrays have no 8-bit form
	}
	switch {
	case u <= 0xff && kind != mpArray:
		return append(b, op, byte(u)), nil
	case u <= 0xffff:
		return append(b, op+1, byte(u>>8), byte(u)), nil
	default:
		return binary.BigEndian.AppendUint32(append(b, op+2), uint32(u)), nil
	}
}

// msgpackUint appends a non-negative int in its shortest form.
func msgpackUint(b []byte, u uint64) []byte {
	switch {
	case u < 0x80:
		return append(b, byte(u))
	case u <= 0xff:
		return append(b, mpUint8, byte(u))
	case u <= 0xffff:
		return append(b, mpUint16, byte(u>>8), byte(u))
	case u <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, mpUint32), uint32(u))
	default:
		return binary.BigEndian.AppendUint64(append(b, mpUint64), u)
	}
}

// msgpackInt appends a signed int in its shortest form.
func msgpackInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return msgpackUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v)) // negative fixint
	case v >= -1<<7:
		return append(b, mpInt8, byte(v))
	case v >= -1<<15:
		return append(b, mpInt16, byte(v>>8), byte(v))
	case v >= -1<<31:
		return binary.BigEndian.AppendUint32(append(b, mpInt32), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(b, mpInt64), uint64(v))
	}
}

func msgpackString(b []byte, s string) ([]byte, error) {
	b, err := msgpackHead(b, mpStr, len(s))
	if err != nil {
		return b, err
	}
	return append(b, s...), nil
}

func msgpackValue(b []byte, v any, depth int) ([]byte, error) {
	if i, u, unsigned, ok := intValue(v); ok {
		if unsigned {
			return msgpackUint(b, u), nil
		}
		return msgpackInt(b, i), nil
	}
	var err error
	switch x := v.(type) {
	case nil:
		return append(b, mpNil), nil
	case string:
		return msgpackString(b, x)
	case []byte:
		if b, err = msgpackHead(b, mpBin, len(x)); err != nil {
			return b, err
		}
		return append(b, x...), nil
	case bool:
		if x {
			return append(b, mpTrue), nil
		}
		return append(b, mpFalse), nil
	case []any:
		if depth >= pkMaxDepth {
			return b, fmt.Errorf("extra keys nested deeper than %d", pkMaxDepth)
		}
		if b, err = msgpackHead(b, mpArray, len(x)); err != nil {
			return b, err
		}
		for _, e := range x {
			if b, err = msgpackValue(b, e, depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	default:
		return b, fmt.Errorf("%w: %T", errUnsupportedExtra, v)
	}
}

func (e *ExtraKeys) msgpack(b []byte) ([]byte, error) {
	var err error
	if len(e.generic) > 0 {
		if b, err = msgpackHead(b, mpArray, len(e.generic)); err != nil {
			return b, err
		}
		for _, v := range e.generic {
			if b, err = msgpackValue(b, v, 1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	if e.n == 0 {
		return append(b, mpNil), nil
	}
	b = append(b, mpFixArray|byte(e.n))
	for i := 0; i < e.n; i++ {
		if b, err = msgpackString(b, e.s[i]); err != nil {
			return b, err
		}
	}
	return b, nil
}

// appendMsgpackBlock appends msgspec's encoding of (parent, tokens, extra).
func appendMsgpackBlock(buf []byte, parent []byte, tokens []uint32, extraKeys *ExtraKeys) ([]byte, error) {
	b, err := msgpackHead(append(buf, mpFixArray|3), mpBin, len(parent))
	if err != nil {
		return buf, err
	}
	b = append(b, parent...)
	if b, err = msgpackHead(b, mpArray, len(tokens)); err != nil {
		return buf, err
	}
	// Write by index into pre-grown space: this loop is most of the cost
	// not spent in the digest.
	b = slices.Grow(b, 5*len(tokens)+1)
	n := len(b)
	b = b[:n+5*len(tokens)]
	for _, t := range tokens {
		switch {
		case t < 0x80:
			b[n] = byte(t)
			n++
		case t <= 0xff:
			b[n], b[n+1] = mpUint8, byte(t)
			n += 2
		case t <= 0xffff:
			b[n] = mpUint16
			binary.BigEndian.PutUint16(b[n+1:], uint16(t))
			n += 3
		default:
			b[n] = mpUint32
			binary.BigEndian.PutUint32(b[n+1:], t)
			n += 5
		}
	}
	return extraKeys.msgpack(b[:n])
}

// appendMsgpackString appends the encoding of s: the NONE_HASH input.
func appendMsgpackString(buf []byte, s string) ([]byte, error) {
	return msgpackString(buf, s)
}
