package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// reader is a minimal msgpack cursor over one payload. The hot decode path
// uses it instead of msgpack.Decoder because it:
//   - allocates nothing (strings and bins are returned as sub-slices of the
//     payload), so decoding costs no allocation per block hash;
//   - can jump to the end of any value (skip), which is how one malformed event
//     is dropped while the rest of its batch still applies;
//   - cannot panic: every length is checked against the bytes left.
//
// Encoding (tests, demo publisher) uses github.com/vmihailenco/msgpack/v5, so
// the decoder is checked against an independent implementation.
type reader struct {
	b     []byte
	p     int
	elems int // array elements declared so far (MaxElementsPerMessage)
	// hashes is the message's arena for the hashes of small events
	// (decodeHashes): a message of one-block BlockRemoved events (an
	// eviction sweep) allocates once per 64 of them, not once per event.
	hashes []uint64
}

// ErrTooManyElements: the payload declares more than MaxElementsPerMessage
// array elements in all (the batch is dropped whole).
var ErrTooManyElements = errors.New("msgpack: more array elements than a message may hold")

var (
	errTruncated = errors.New("msgpack: truncated value")
	errTooDeep   = errors.New("msgpack: nesting too deep")
)

// maxDepth bounds the nesting of values we decode (extra-keys tuples);
// maxSkipDepth bounds what skip walks through, so hostile input cannot
// exhaust the stack while a merely odd event is still skipped on its own.
const (
	maxDepth     = 16
	maxSkipDepth = 256
)

type typeError struct {
	want string
	code byte
}

func (e *typeError) Error() string {
	return fmt.Sprintf("msgpack: want %s, got code 0x%02x", e.want, e.code)
}

func (r *reader) remaining() int { return len(r.b) - r.p }

func (r *reader) peek() (byte, error) {
	if r.p >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.p], nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.p {
		return nil, errTruncated
	}
	s := r.b[r.p : r.p+n : r.p+n]
	r.p += n
	return s, nil
}

func (r *reader) u8() (uint64, error) {
	s, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return uint64(s[0]), nil
}

func (r *reader) u16() (uint64, error) {
	s, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint16(s)), nil
}

func (r *reader) u32() (uint64, error) {
	s, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return uint64(binary.BigEndian.Uint32(s)), nil
}

func (r *reader) u64() (uint64, error) {
	s, err := r.take(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(s), nil
}

// nextNil consumes a nil and reports true, or leaves the cursor alone.
func (r *reader) nextNil() bool {
	if r.p < len(r.b) && r.b[r.p] == 0xc0 {
		r.p++
		return true
	}
	return false
}

func isIntCode(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3)
}

// intBits reads any msgpack integer and returns its value as a two's
// complement uint64 (negative numbers sign-extended), plus whether the
// encoding was a signed type holding a negative value.
func (r *reader) intBits() (bits uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.p++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.p++
		return uint64(int64(int8(c))), true, nil
	}
	r.p++
	var v uint64
	switch c {
	case 0xcc:
		v, err = r.u8()
	case 0xcd:
		v, err = r.u16()
	case 0xce:
		v, err = r.u32()
	case 0xcf:
		v, err = r.u64()
	case 0xd0:
		v, err = r.u8()
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, err = r.u16()
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, err = r.u32()
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, err = r.u64()
	default:
		r.p--
		return 0, false, &typeError{"int", c}
	}
	if err != nil {
		return 0, false, err
	}
	return v, c >= 0xd0 && int64(v) < 0, nil
}

// int64v reads an integer that must fit in int64.
func (r *reader) int64v() (int64, error) {
	c, _ := r.peek()
	v, neg, err := r.intBits()
	if err != nil {
		return 0, err
	}
	if !neg && c == 0xcf && v > math.MaxInt64 {
		return 0, fmt.Errorf("msgpack: integer %d overflows int64", v)
	}
	return int64(v), nil
}

// float reads a float or an integer as float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.p++
		v, err := r.u32()
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.p++
		v, err := r.u64()
		return math.Float64frombits(v), err
	}
	if isIntCode(c) {
		v, err := r.int64v()
		return float64(v), err
	}
	return 0, &typeError{"float", c}
}

// strOrBin reads a str or bin value and returns its bytes (a sub-slice of
// the payload: valid only while the payload is).
func (r *reader) strOrBin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.p++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.p++
		n, err = r.u8()
	case c == 0xda || c == 0xc5:
		r.p++
		n, err = r.u16()
	case c == 0xdb || c == 0xc6:
		r.p++
		n, err = r.u32()
	default:
		return nil, &typeError{"str or bin", c}
	}
	if err != nil {
		return nil, err
	}
	return r.take(int(n))
}

func isStrCode(c byte) bool {
	return (c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb
}

func isBinCode(c byte) bool { return c == 0xc4 || c == 0xc5 || c == 0xc6 }

func isArrayCode(c byte) bool { return (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd }

func isMapCode(c byte) bool { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }

// arrayLen reads an array header. The length is checked against the bytes
// left (every element takes at least one byte) so a hostile header cannot
// make the caller allocate gigabytes.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.p++
		n = uint64(c & 0x0f)
	case c == 0xdc:
		r.p++
		n, err = r.u16()
	case c == 0xdd:
		r.p++
		n, err = r.u32()
	default:
		return 0, &typeError{"array", c}
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.remaining()) {
		return 0, errTruncated
	}
	if r.elems += int(n); r.elems > MaxElementsPerMessage {
		return 0, ErrTooManyElements
	}
	return int(n), nil
}

// mapLen reads a map header (number of key/value pairs).
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.p++
		n = uint64(c & 0x0f)
	case c == 0xde:
		r.p++
		n, err = r.u16()
	case c == 0xdf:
		r.p++
		n, err = r.u32()
	default:
		return 0, &typeError{"map", c}
	}
	if err != nil {
		return 0, err
	}
	if 2*n > uint64(r.remaining()) {
		return 0, errTruncated
	}
	return int(n), nil
}

// skip moves past one complete value of any type.
func (r *reader) skip() error { return r.skipDepth(0) }

func (r *reader) skipDepth(depth int) error {
	if depth > maxSkipDepth {
		return errTooDeep
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.p++
		return nil
	case isIntCode(c):
		_, _, err = r.intBits()
		return err
	case c == 0xca || c == 0xcb:
		_, err = r.float()
		return err
	case isStrCode(c) || isBinCode(c):
		_, err = r.strOrBin()
		return err
	case isArrayCode(c):
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := r.skipDepth(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMapCode(c):
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := r.skipDepth(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	// ext types: fixext 1/2/4/8/16 and ext 8/16/32 (type byte + data)
	r.p++
	var n uint64
	switch c {
	case 0xd4:
		n = 1
	case 0xd5:
		n = 2
	case 0xd6:
		n = 4
	case 0xd7:
		n = 8
	case 0xd8:
		n = 16
	case 0xc7:
		n, err = r.u8()
	case 0xc8:
		n, err = r.u16()
	case 0xc9:
		n, err = r.u32()
	default: // 0xc1 is never used
		return &typeError{"valid msgpack", c}
	}
	if err != nil {
		return err
	}
	_, err = r.take(int(n) + 1)
	return err
}
