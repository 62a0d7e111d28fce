package persist

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// craft builds a version-1 file by hand: model "m", pod "p" (rank 0, no
// sequence), one block (key 5 of "m") held by "p" with the holder field hf.
func craft(hf uint64, created time.Time) []byte {
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	e := encoder{w: bw}
	e.raw([]byte(magic))
	e.u32(1)
	e.u64(uint64(created.UnixNano()))
	e.u64(uint64(probeKey))
	e.uvarint(1)
	e.uvarint(0)
	e.str("m")
	e.u64(uint64(kvindex.SlotKeyOf(0, probeKey)))
	e.uvarint(1)
	e.str("p")
	e.uvarint(0)
	e.u8(0)
	e.uvarint(0)
	e.u8(1)
	e.u64(uint64(kvindex.SlotKeyOf(0, 5)))
	e.uvarint(1)
	e.uvarint(0)
	e.uvarint(hf)
	e.u8(0)
	e.u64(1)
	e.u64(1)
	if err := bw.Flush(); err != nil || e.err != nil {
		panic("bytes.Buffer cannot fail")
	}
	return binary.LittleEndian.AppendUint32(buf.Bytes(), crc32.Checksum(buf.Bytes(), castagnoli))
}

// A holder's field is its tier. Version 1 also defined bits above the tier
// for a KV-cache group the daemon always wrote as 0, so every version-1 file
// has this layout, loads as it is, and is what Write produces. A field with
// a group bit set was never written by the daemon: it is refused as
// corrupt, leaving the index empty (a cold start).
func TestHolderFieldIsTheTier(t *testing.T) {
	created := time.Unix(1700000000, 0)
	dir := t.TempDir()

	f := newFleet(1 << 10)
	f.add(t, "m", "p", 0, event.TierCPU, []blockkeys.Key{5})
	path := filepath.Join(dir, "written.snap")
	write(t, f, path, nil)
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := craft(uint64(event.TierCPU), created); !bytes.Equal(written, want) {
		t.Fatalf("Write produced\n%x\nwant the version-1 layout\n%x", written, want)
	}

	g := newFleet(1 << 10)
	if _, err := Load(writeTmp(t, dir, craft(uint64(event.TierCPU), created)), g.idx, g.in); err != nil {
		t.Fatal(err)
	}
	if got := g.holders(t, "m", 5); !slices.Equal(got, []string{"p/0/cpu"}) {
		t.Fatalf("holders %v, want p/0/cpu", got)
	}

	h := newFleet(1 << 10)
	_, err = Load(writeTmp(t, dir, craft(uint64(event.TierCPU)|1<<2, created)), h.idx, h.in)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a holder with a group bit: err %v, want ErrCorrupt", err)
	}
	if n := h.idx.Stats().Entries; n != 0 {
		t.Fatalf("%d entries visible after a refused load", n)
	}
}
