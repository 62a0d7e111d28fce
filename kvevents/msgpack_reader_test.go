package kvevents

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The msgpack reader's primitives against the spec and the independent
// encoder, at every width edge: the str16/32, bin16/32 and map32 headers,
// the one-byte codes at the ends of each range and the sign flag.

// specClass is the msgpack spec's format table, written out byte by byte.
func specClass(c int) string {
	switch {
	case c <= 0x7f, c >= 0xe0, c >= 0xcc && c <= 0xd3:
		return "int"
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return "map"
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return "array"
	case c >= 0xa0 && c <= 0xbf, c == 0xd9, c == 0xda, c == 0xdb:
		return "str"
	case c == 0xc4, c == 0xc5, c == 0xc6:
		return "bin"
	}
	return ""
}

func TestReaderCodeClassesMatchSpec(t *testing.T) {
	for c := 0; c < 256; c++ {
		b := byte(c)
		got := ""
		for _, k := range []struct {
			name string
			is   func(byte) bool
		}{{"int", isIntCode}, {"map", isMapCode}, {"array", isArrayCode}, {"str", isStrCode}, {"bin", isBinCode}} {
			if k.is(b) {
				if got != "" {
					t.Fatalf("code 0x%02x is both %s and %s", c, got, k.name)
				}
				got = k.name
			}
		}
		if want := specClass(c); got != want {
			t.Fatalf("code 0x%02x classified %q, spec says %q", c, got, want)
		}
	}
}

// Every integer edge in every encoding the spec allows for it: intBits gives
// the two's complement bits and says negative only for a signed type
// holding a negative value; int64v refuses a uint64 above int64 only;
// float reads any of them; skip moves past exactly the value.
func TestReaderIntegersAtEveryWidth(t *testing.T) {
	type enc struct {
		b   []byte
		v   uint64
		neg bool
	}
	be := func(code byte, n int, v uint64) []byte {
		b := []byte{code}
		for i := n - 1; i >= 0; i-- {
			b = append(b, byte(v>>(8*i)))
		}
		return b
	}
	var cases []enc
	for _, v := range []int64{0, 1, 0x7f, -1, -32, -33, math.MinInt8, math.MaxInt8, math.MinInt16, math.MaxInt16,
		math.MinInt32, math.MaxInt32, math.MinInt64, math.MaxInt64} {
		u := uint64(v)
		if v >= 0 && v <= 0x7f {
			cases = append(cases, enc{[]byte{byte(v)}, u, false})
		}
		if v >= -32 && v < 0 {
			cases = append(cases, enc{[]byte{byte(v)}, u, true})
		}
		if v >= math.MinInt8 && v <= math.MaxInt8 {
			cases = append(cases, enc{be(0xd0, 1, u), u, v < 0})
		}
		if v >= math.MinInt16 && v <= math.MaxInt16 {
			cases = append(cases, enc{be(0xd1, 2, u), u, v < 0})
		}
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			cases = append(cases, enc{be(0xd2, 4, u), u, v < 0})
		}
		cases = append(cases, enc{be(0xd3, 8, u), u, v < 0})
	}
	for _, v := range []uint64{0, 0xff, 0xffff, 0xffffffff, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
		if v <= 0xff {
			cases = append(cases, enc{be(0xcc, 1, v), v, false})
		}
		if v <= 0xffff {
			cases = append(cases, enc{be(0xcd, 2, v), v, false})
		}
		if v <= 0xffffffff {
			cases = append(cases, enc{be(0xce, 4, v), v, false})
		}
		cases = append(cases, enc{be(0xcf, 8, v), v, false})
	}
	for _, c := range cases {
		payload := append(append([]byte(nil), c.b...), 0xc0) // a trailing nil: nothing may read into it
		r := &reader{b: payload}
		v, neg, err := r.intBits()
		if err != nil || v != c.v || neg != c.neg || r.p != len(c.b) {
			t.Fatalf("intBits(% x) = %#x %v %v at %d, want %#x %v at %d", c.b, v, neg, err, r.p, c.v, c.neg, len(c.b))
		}
		overflow := c.b[0] == 0xcf && c.v > math.MaxInt64
		r = &reader{b: payload}
		i, err := r.int64v()
		if overflow != (err != nil) || (!overflow && i != int64(c.v)) {
			t.Fatalf("int64v(% x) = %d %v", c.b, i, err)
		}
		r = &reader{b: payload}
		f, err := r.float()
		if overflow != (err != nil) || (!overflow && f != float64(int64(c.v))) {
			t.Fatalf("float(% x) = %v %v", c.b, f, err)
		}
		r = &reader{b: payload}
		if err := r.skip(); err != nil || r.p != len(c.b) {
			t.Fatalf("skip(% x): %v at %d", c.b, err, r.p)
		}
		// the independent encoder agrees on the value
		var ref any
		if err := msgpack.Unmarshal(c.b, &ref); err != nil {
			t.Fatal(err)
		}
	}
	// a non-integer leaves the cursor on it, for the caller's error path
	for _, b := range [][]byte{{0xc0}, {0xc1}, {0xca, 0, 0, 0, 0}, {0xa1, 'x'}, {0x90}, {0xd4, 1, 2}} {
		r := &reader{b: b}
		if _, _, err := r.intBits(); err == nil || r.p != 0 {
			t.Fatalf("intBits(% x): %v, cursor %d", b, err, r.p)
		}
	}
}

// Strings and bins of every header width, at the lengths where the width
// changes: read back whole, skipped exactly, and refused when truncated.
func TestReaderStrAndBinEveryHeader(t *testing.T) {
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("k", n)
		for _, v := range []any{s, []byte(s)} {
			b, err := msgpack.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			r := &reader{b: append(b, 0xc0)}
			got, err := r.strOrBin()
			if err != nil || string(got) != s || r.p != len(b) {
				t.Fatalf("strOrBin(%T of %d, header % x) = %d bytes, %v, at %d of %d", v, n, b[:min(len(b), 5)], len(got), err, r.p, len(b))
			}
			r = &reader{b: append(b, 0xc0)}
			if err := r.skip(); err != nil || r.p != len(b) {
				t.Fatalf("skip(%T of %d): %v at %d of %d", v, n, err, r.p, len(b))
			}
			if n > 0 {
				r = &reader{b: b[:len(b)-1]}
				if _, err := r.strOrBin(); !errors.Is(err, errTruncated) {
					t.Fatalf("truncated %T of %d: %v", v, n, err)
				}
			}
		}
	}
}

// Map headers of every width: the pair count, exactly the pairs skipped,
// and a count the bytes left cannot hold refused at the header.
func TestReaderMapEveryHeader(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 15, 16, 65535, 65536} {
		m := make(map[string]int8, n)
		for i := 0; i < n; i++ {
			m[strconv.Itoa(i)] = int8(i)
		}
		if len(m) != n {
			t.Fatalf("test map has %d keys, want %d", len(m), n)
		}
		b, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		r := &reader{b: append(b, 0xc0)}
		got, err := r.mapLen()
		if err != nil || got != n {
			t.Fatalf("mapLen of %d pairs = %d %v", n, got, err)
		}
		r = &reader{b: append(b, 0xc0)}
		if err := r.skip(); err != nil || r.p != len(b) {
			t.Fatalf("skip(map of %d): %v at %d of %d", n, err, r.p, len(b))
		}
	}
	for _, h := range [][]byte{{0x81}, {0x8f}, {0xde, 0, 3, 1, 2, 3, 4, 5}, {0xdf, 0, 1, 0, 0, 1, 2}} {
		r := &reader{b: h}
		if _, err := r.mapLen(); !errors.Is(err, errTruncated) {
			t.Fatalf("mapLen(% x) with too few bytes for its pairs: %v", h, err)
		}
	}
}

// MaxElementsPerMessage is a total over the payload's arrays: reaching it
// exactly is allowed, one element more is refused.
func TestReaderElementLimitExact(t *testing.T) {
	r := &reader{b: []byte{0x93, 1, 2, 3, 0x91, 1}, elems: MaxElementsPerMessage - 3}
	if n, err := r.arrayLen(); err != nil || n != 3 {
		t.Fatalf("up to the limit: %d %v", n, err)
	}
	r.p = 4
	if _, err := r.arrayLen(); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("one past the limit: %v", err)
	}
}

// skip's depth bound counts maps as it counts arrays: values nested in maps
// deeper than maxSkipDepth are refused (hostile input cannot grow the
// stack), up to it they are skipped whole.
func TestReaderSkipDepthThroughMaps(t *testing.T) {
	nestedMaps := func(depth int) []byte { // {"": {"": ... 0x01}}: the int at depth
		var b []byte
		for i := 0; i < depth; i++ {
			b = append(b, 0x81, 0xa0)
		}
		return append(b, 0x01)
	}
	b := nestedMaps(maxSkipDepth)
	r := &reader{b: append(b, 0xc0)}
	if err := r.skip(); err != nil || r.p != len(b) {
		t.Fatalf("maps nested to the limit: %v at %d of %d", err, r.p, len(b))
	}
	r = &reader{b: nestedMaps(maxSkipDepth + 1)}
	if err := r.skip(); !errors.Is(err, errTooDeep) {
		t.Fatalf("maps nested past the limit: %v", err)
	}
}
