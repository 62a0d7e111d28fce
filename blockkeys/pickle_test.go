package blockkeys

import (
	"bytes"
	"testing"
)

// TestPickleBlobHeaderWidths pins the length opcodes of pickletools'
// protocol table at each width change, including BINUNICODE8/BINBYTES8 for
// payloads of 4 GiB, which no reference vector can reach at a sane size.
func TestPickleBlobHeaderWidths(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		text bool
		want []byte
	}{
		{255, true, []byte{0x8c, 0xff}},
		{256, true, []byte{'X', 0, 1, 0, 0}},
		{255, false, []byte{'C', 0xff}},
		{256, false, []byte{'B', 0, 1, 0, 0}},
		{0xffffffff, true, []byte{'X', 0xff, 0xff, 0xff, 0xff}},
		{1 << 32, true, []byte{0x8d, 0, 0, 0, 0, 1, 0, 0, 0}},
		{1 << 32, false, []byte{0x8e, 0, 0, 0, 0, 1, 0, 0, 0}},
	} {
		var hdr [9]byte
		if got := blobHeader(&hdr, c.n, c.text); !bytes.Equal(got, c.want) {
			t.Errorf("n=%d text=%v: header % x, want % x", c.n, c.text, got, c.want)
		}
	}
}
