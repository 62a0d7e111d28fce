package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
)

// A copy for a peer records each stream's completeness (version 2); a
// copy without any stays version 1, byte for byte what Write puts in a
// file; and a file is never believed complete, whatever it says.
func TestCompletenessIsOnlyInPeerCopies(t *testing.T) {
	f, _ := sample(t)
	seqs := []StreamSeq{{Pod: "pod-1", Seq: 41, Complete: true, CompleteSince: 9}, {Pod: "pod-3", DPRank: 1, Seq: 7}}
	var buf bytes.Buffer
	w, err := Encode(&buf, Source{Index: f.idx, Interner: f.in, Streams: func() []StreamSeq { return seqs }}, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if w.Bytes != int64(buf.Len()) {
		t.Errorf("Written.Bytes %d, encoded %d", w.Bytes, buf.Len())
	}
	if v := binary.LittleEndian.Uint32(buf.Bytes()[len(magic):]); v != version2 {
		t.Fatalf("a copy with a complete stream is version %d, want %d", v, version2)
	}
	g := newFleet(0)
	l, err := LoadFrom(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "copy", g.idx, g.in, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Entries != w.Entries {
		t.Errorf("loaded %d entries of %d", l.Entries, w.Entries)
	}
	got := map[string]RestoredPod{}
	for _, p := range l.Pods {
		got[p.Name] = p
	}
	if p := got["pod-1"]; !p.HasSeq || p.Seq != 41 || !p.Complete || p.CompleteSince != 9 {
		t.Errorf("pod-1 %+v, want seq 41, complete since 9", p)
	}
	if p := got["pod-3"]; !p.HasSeq || p.Seq != 7 || p.Complete {
		t.Errorf("pod-3 %+v, want seq 7, not complete", p)
	}

	// The same bytes as a file: loaded, but nothing is complete.
	path := writeTmp(t, t.TempDir(), buf.Bytes())
	h := newFleet(0)
	l, err = LoadLimited(path, h.idx, h.in, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Pods {
		if p.Complete || p.CompleteSince != 0 {
			t.Errorf("a file's pod %s loaded complete: %+v", p.Name, p)
		}
	}

	// Without completeness: version 1, the bytes a file holds.
	for i := range seqs {
		seqs[i].Complete = false
	}
	buf.Reset()
	if _, err := Encode(&buf, Source{Index: f.idx, Interner: f.in, Streams: func() []StreamSeq { return seqs }}, time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "index.snap")
	write(t, f, file, seqs)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, buf.Bytes()) {
		t.Errorf("Encode without completeness differs from the file Write makes (%d vs %d bytes)", buf.Len(), len(b))
	}
}

// A complete bit without a sequence number (flags 2) is corrupt.
func TestCompleteWithoutSeqIsCorrupt(t *testing.T) {
	f := newFleet(0)
	f.add(t, "m", "p", 0, 0, []blockkeys.Key{1, 2})
	var buf bytes.Buffer
	seqs := []StreamSeq{{Pod: "p", Seq: 1, Complete: true, CompleteSince: 0}}
	if _, err := Encode(&buf, Source{Index: f.idx, Interner: f.in, Streams: func() []StreamSeq { return seqs }}, time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	// the pod's flags byte follows its name "p" and rank 0
	i := bytes.Index(b, []byte{1, 'p', 0, 3})
	if i < 0 {
		t.Fatal("pod entry not found")
	}
	b[i+3] = 2
	b = binary.LittleEndian.AppendUint32(b[:len(b)-4:len(b)-4], crc32.Checksum(b[:len(b)-4], castagnoli))
	g := newFleet(0)
	if _, err := LoadFrom(bytes.NewReader(b), int64(len(b)), "crafted", g.idx, g.in, Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flags 2: %v, want ErrCorrupt", err)
	}
}
