package blockkeys

import (
	"bytes"
	"errors"
	"testing"
)

// TestMsgpackHeadWidths pins the head at each width change (the msgpack
// spec's format table); the 2^32 limit cannot be reached by a vector.
func TestMsgpackHeadWidths(t *testing.T) {
	for _, c := range []struct {
		kind mpKind
		n    int
		want []byte
	}{
		{mpStr, 31, []byte{0xbf}},
		{mpStr, 32, []byte{0xd9, 32}},
		{mpStr, 256, []byte{0xda, 1, 0}},
		{mpStr, 65536, []byte{0xdb, 0, 1, 0, 0}},
		{mpBin, 0, []byte{0xc4, 0}},
		{mpBin, 65535, []byte{0xc5, 0xff, 0xff}},
		{mpBin, 65536, []byte{0xc6, 0, 1, 0, 0}},
		{mpArray, 15, []byte{0x9f}},
		{mpArray, 16, []byte{0xdc, 0, 16}},
		{mpArray, 65536, []byte{0xdd, 0, 1, 0, 0}},
	} {
		got, err := msgpackHead(nil, c.kind, c.n)
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("kind %d n=%d: % x %v, want % x", c.kind, c.n, got, err, c.want)
		}
	}
	for _, k := range []mpKind{mpStr, mpBin, mpArray} {
		if _, err := msgpackHead(nil, k, 1<<32); !errors.Is(err, errMsgpackTooLong) {
			t.Errorf("kind %d: 2^32 items gave %v", k, err)
		}
	}
}
