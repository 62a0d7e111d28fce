package blockkeys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unicode/utf8"
)

// This file reproduces, byte for byte, what CPython's C pickler (_pickle.c)
// emits for pickle.dumps(x, protocol=5) when x is a block-hash input: a tuple of
// (parent digest bytes, tuple of token ints, None or a tuple of extra keys).
// vLLM's "sha256" and "xxhash" algorithms hash exactly these bytes
// (vllm/utils/hashing.py: pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)),
// so every opcode choice below matters:
//
//   - PROTO 5 header outside any frame, then FRAME opcodes: a frame is opened
//     lazily by the first write and closed (committed) at an "opcode boundary"
//     once it holds >= 64 KiB, and after STOP. The C pickler checks that
//     boundary when it STARTS saving an object (save() calls
//     _Pickler_OpcodeBoundary first), never after one: the TUPLE opcode and
//     MEMOIZE that close a tuple stay in the frame of its last item even when
//     that item filled it. A frame of fewer than 4 bytes is written without
//     its FRAME header.
//   - ints: BININT1 (0..255), BININT2 (256..65535), BININT (other 32-bit signed),
//     else LONG1 with Python's minimal two's-complement little-endian bytes.
//   - bytes/str: SHORT_BINBYTES/BINBYTES(8) and SHORT_BINUNICODE/BINUNICODE(8),
//     each followed by MEMOIZE; payloads >= 64 KiB are written outside frames
//     (the open frame is committed first, MEMOIZE then opens a new one).
//   - tuples: EMPTY_TUPLE (no memo), TUPLE1..3 for 1-3 items, else MARK..TUPLE;
//     non-empty tuples are followed by MEMOIZE.
//
// The memo: pickle emits BINGET instead of a second copy when the very same
// object is saved twice. vLLM builds every block input from fresh objects, with
// one CPython exception we must mirror: the empty str and every 1-character str
// with a code point < 256 are interned singletons (whatever decoded them), so a
// LoRA name "a" and a cache_salt "a" in one tuple pickle as SHORT_BINUNICODE
// then BINGET. Longer strings, bytes and tuples are never shared.

const (
	pkProto          = 0x80
	pkFrame          = 0x95
	pkStop           = '.'
	pkNone           = 'N'
	pkNewTrue        = 0x88
	pkNewFalse       = 0x89
	pkBinInt1        = 'K'
	pkBinInt2        = 'M'
	pkBinInt         = 'J'
	pkLong1          = 0x8a
	pkShortBinBytes  = 'C'
	pkBinBytes       = 'B'
	pkShortBinUnicod = 0x8c
	pkBinUnicode     = 'X'
	pkBinUnicode8    = 0x8d
	pkBinBytes8      = 0x8e
	pkMemoize        = 0x94
	pkMark           = '('
	pkTuple          = 't'
	pkEmptyTuple     = ')'
	pkTuple1         = 0x85
	pkTuple2         = 0x86
	pkTuple3         = 0x87
	pkBinGet         = 'h'
	pkLongBinGet     = 'j'

	pkFrameHeader = 9        // FRAME opcode + 8-byte length
	pkFrameTarget = 64 << 10 // _pickle.c FRAME_SIZE_TARGET
	pkFrameMin    = 4        // _pickle.c FRAME_SIZE_MIN
	pkMaxDepth    = 32       // nesting limit for extra-key tuples (bad input guard)
)

var errUnsupportedExtra = errors.New("unsupported extra-key value type")

// pickler appends one protocol-5 pickle to buf. frame is the offset of the open
// frame's header in buf, or -1 when no frame is open.
type pickler struct {
	buf   []byte
	frame int
	memo  int // next memo index (MEMOIZE count)
	// memo indexes of the interned 1-char strings saved so far: a few inline
	// (the request path has at most two strings), the rest in a map made
	// only for extra keys with more distinct ones
	nsingle int
	single  [4]struct {
		r   rune
		idx int
	}
	moreSingle map[rune]int
}

// singleton reports whether CPython shares one object for every str equal to s.
func singleton(s string) (rune, bool) {
	if s == "" {
		return -1, true
	}
	r, n := utf8.DecodeRuneInString(s)
	return r, n == len(s) && r < 256 && r != utf8.RuneError
}

func (p *pickler) open() {
	if p.frame < 0 {
		p.frame = len(p.buf)
		p.buf = append(p.buf, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
	}
}

// commit closes the open frame (_Pickler_CommitFrame).
func (p *pickler) commit() {
	if p.frame < 0 {
		return
	}
	n := len(p.buf) - p.frame - pkFrameHeader
	if n >= pkFrameMin {
		binary.LittleEndian.PutUint64(p.buf[p.frame+1:], uint64(n))
	} else {
		copy(p.buf[p.frame:], p.buf[p.frame+pkFrameHeader:])
		p.buf = p.buf[:len(p.buf)-pkFrameHeader]
	}
	p.frame = -1
}

// boundary is _Pickler_OpcodeBoundary, run when saving an object starts.
func (p *pickler) boundary() {
	if p.frame >= 0 && len(p.buf)-p.frame-pkFrameHeader >= pkFrameTarget {
		p.commit()
	}
}

// get writes a memo reference (memo_get in _pickle.c).
func (p *pickler) get(idx int) {
	p.open()
	if idx < 256 {
		p.buf = append(p.buf, pkBinGet, byte(idx))
	} else {
		p.buf = append(p.buf, pkLongBinGet, byte(idx), byte(idx>>8), byte(idx>>16), byte(idx>>24))
	}
}

func (p *pickler) memoize() {
	p.op(pkMemoize)
	p.memo++
}

func (p *pickler) op(b byte) {
	p.open()
	p.buf = append(p.buf, b)
}

// int saves a Python int that fits in int64.
func (p *pickler) int(v int64) {
	p.boundary()
	p.open()
	switch {
	case v >= 0 && v <= 0xff:
		p.buf = append(p.buf, pkBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		p.buf = append(p.buf, pkBinInt2, byte(v), byte(v>>8))
	case v >= -1<<31 && v < 1<<31:
		p.buf = append(p.buf, pkBinInt, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	default:
		p.long1(uint64(v), v < 0)
	}
}

// uint saves a non-negative Python int that fits in uint64.
func (p *pickler) uint(v uint64) {
	if v < 1<<31 {
		p.int(int64(v))
		return
	}
	p.boundary()
	p.open()
	p.long1(v, false)
}

// long1 writes LONG1 for the 64-bit two's-complement value u (neg = sign),
// with Python's encode_long length: bit_length(|x|)/8 + 1 bytes, then one
// redundant 0xff dropped for negatives.
func (p *pickler) long1(u uint64, neg bool) {
	mag := u
	if neg {
		mag = -u
	}
	n := bits.Len64(mag)/8 + 1
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], u)
	if neg {
		b[8] = 0xff
	}
	if neg && n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
		n--
	}
	p.buf = append(p.buf, pkLong1, byte(n))
	p.buf = append(p.buf, b[:n]...)
}

// singletonIndex returns the memo index of the interned str for r, if saved.
func (p *pickler) singletonIndex(r rune) (int, bool) {
	for i := 0; i < p.nsingle; i++ {
		if p.single[i].r == r {
			return p.single[i].idx, true
		}
	}
	idx, ok := p.moreSingle[r]
	return idx, ok
}

func (p *pickler) addSingleton(r rune, idx int) {
	if p.nsingle < len(p.single) {
		p.single[p.nsingle].r, p.single[p.nsingle].idx = r, idx
		p.nsingle++
		return
	}
	if p.moreSingle == nil {
		p.moreSingle = make(map[rune]int)
	}
	p.moreSingle[r] = idx
}

// blobHeader returns the opcode and length bytes for a payload of n bytes
// (save_bytes / write_unicode_binary in _pickle.c, protocol >= 4).
func blobHeader(hdr *[9]byte, n uint64, text bool) []byte {
	switch {
	case n < 256:
		hdr[0], hdr[1] = pkShortBinBytes, byte(n)
		if text {
			hdr[0] = pkShortBinUnicod
		}
		return hdr[:2]
	case n <= 0xffffffff:
		hdr[0] = pkBinBytes
		if text {
			hdr[0] = pkBinUnicode
		}
		binary.LittleEndian.PutUint32(hdr[1:], uint32(n))
		return hdr[:5]
	default: // 4 GiB and more: unreachable for block-hash inputs in practice
		hdr[0] = pkBinBytes8
		if text {
			hdr[0] = pkBinUnicode8
		}
		binary.LittleEndian.PutUint64(hdr[1:], n)
		return hdr[:9]
	}
}

// blob writes a bytes (text=false) or str (text=true) payload with MEMOIZE.
func (p *pickler) blob(s string, b []byte, text bool) {
	p.boundary()
	if text {
		if r, ok := singleton(s); ok {
			if idx, ok := p.singletonIndex(r); ok {
				p.get(idx)
				return
			}
			p.addSingleton(r, p.memo)
		}
	}
	n := len(s) + len(b)
	var hdr [9]byte
	h := blobHeader(&hdr, uint64(n), text)
	if n >= pkFrameTarget {
		// _Pickler_write_bytes: large payloads go outside frames.
		p.commit()
		p.buf = append(p.buf, h...)
	} else {
		p.open()
		p.buf = append(p.buf, h...)
	}
	p.buf = append(p.buf, s...)
	p.buf = append(p.buf, b...)
	p.memoize()
}

// tupleEnd closes a tuple of n items whose items are already saved. No
// opcode boundary here: the closing opcodes join the last item's frame.
func (p *pickler) tupleEnd(n int) {
	switch n {
	case 0:
		p.op(pkEmptyTuple)
		return
	case 1:
		p.op(pkTuple1)
	case 2:
		p.op(pkTuple2)
	case 3:
		p.op(pkTuple3)
	default:
		p.op(pkTuple)
	}
	p.memoize()
}

// tupleStart begins saving a tuple of n items.
func (p *pickler) tupleStart(n int) {
	p.boundary()
	if n > 3 {
		p.op(pkMark)
	}
}

func (p *pickler) tokens(t []uint32) {
	p.tupleStart(len(t))
	if len(t) == 0 {
		p.tupleEnd(0)
		return
	}
	p.open()
	if len(p.buf)-p.frame-pkFrameHeader+7*len(t) < pkFrameTarget {
		// Fast path: even at 7 bytes per id the tuple cannot reach the frame
		// target, so no opcode boundary inside it commits the frame. Write by
		// index into pre-grown space (this loop is most of the hashing cost
		// not spent in the digest).
		p.buf = pickleTokens(slices.Grow(p.buf, 7*len(t)), t)
	} else {
		for i := range t {
			p.boundary() // before each int, as save() does
			p.open()
			p.buf = pickleTokens(slices.Grow(p.buf, 7), t[i:i+1])
		}
	}
	p.tupleEnd(len(t))
}

// pickleTokens appends the int opcodes of t; cap(b) must leave 7 bytes per id.
func pickleTokens(b []byte, t []uint32) []byte {
	n := len(b)
	b = b[:n+7*len(t)]
	for _, v := range t {
		switch {
		case v <= 0xff:
			b[n], b[n+1] = pkBinInt1, byte(v)
			n += 2
		case v <= 0xffff:
			b[n], b[n+1], b[n+2] = pkBinInt2, byte(v), byte(v>>8)
			n += 3
		case v < 1<<31:
			b[n] = pkBinInt
			binary.LittleEndian.PutUint32(b[n+1:], v)
			n += 5
		default:
			// 2^31..2^32-1 need 5 bytes: the value plus a zero sign byte.
			b[n], b[n+1] = pkLong1, 5
			binary.LittleEndian.PutUint32(b[n+2:], v)
			b[n+6] = 0
			n += 7
		}
	}
	return b[:n]
}

// value saves one generic extra-key value.
func (p *pickler) value(v any, depth int) error {
	if i, u, unsigned, ok := intValue(v); ok {
		if unsigned {
			p.uint(u)
		} else {
			p.int(i)
		}
		return nil
	}
	switch x := v.(type) {
	case nil:
		p.boundary()
		p.op(pkNone)
	case string:
		p.blob(x, nil, true)
	case []byte:
		p.blob("", x, false)
	case bool:
		p.boundary()
		if x {
			p.op(pkNewTrue)
		} else {
			p.op(pkNewFalse)
		}
	case []any:
		if depth >= pkMaxDepth {
			return fmt.Errorf("extra keys nested deeper than %d", pkMaxDepth)
		}
		p.tupleStart(len(x))
		for _, e := range x {
			if err := p.value(e, depth+1); err != nil {
				return err
			}
		}
		p.tupleEnd(len(x))
	default:
		return fmt.Errorf("%w: %T", errUnsupportedExtra, v)
	}
	return nil
}

// appendPickleBlock appends pickle.dumps((parent, tuple(tokens), extra), 5).
func appendPickleBlock(buf []byte, parent []byte, tokens []uint32, extraKeys *ExtraKeys) ([]byte, error) {
	p := pickler{buf: append(buf, pkProto, 5), frame: -1}
	p.tupleStart(3)
	p.blob("", parent, false)
	p.tokens(tokens)
	if err := extraKeys.pickle(&p); err != nil {
		return buf, err
	}
	p.tupleEnd(3)
	p.op(pkStop)
	p.commit()
	return p.buf, nil
}

// appendPickleString appends pickle.dumps(s, 5): the NONE_HASH input.
func appendPickleString(buf []byte, s string) []byte {
	p := pickler{buf: append(buf, pkProto, 5), frame: -1}
	p.blob(s, nil, true)
	p.op(pkStop)
	p.commit()
	return p.buf
}

// intValue reports v as an integer when it has one of Go's integer types:
// signed types as i, unsigned ones as u (unsigned set). Both serialisers
// (pickle and CBOR) encode extra-key integers by value, whatever the width.
func intValue(v any) (i int64, u uint64, unsigned, ok bool) {
	switch x := v.(type) {
	case int64:
		return x, 0, false, true
	case int:
		return int64(x), 0, false, true
	case int32:
		return int64(x), 0, false, true
	case int16:
		return int64(x), 0, false, true
	case int8:
		return int64(x), 0, false, true
	case uint64:
		return 0, x, true, true
	case uint32:
		return 0, uint64(x), true, true
	case uint16:
		return 0, uint64(x), true, true
	case uint8:
		return 0, uint64(x), true, true
	case uint:
		return 0, uint64(x), true, true
	}
	return 0, 0, false, false
}
