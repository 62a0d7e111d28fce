package kvevents

import (
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustPack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSnapshotHeaderAndChunk(t *testing.T) {
	h, err := decodeSnapshotHeader(mustPack(t, []any{1, "e1", 0, 8, 7, "cut", 3}))
	if err != nil || h.epoch != "e1" || h.resumeSeq != 8 || h.barrierSeq != 7 || h.records != 3 {
		t.Fatalf("header %+v %v", h, err)
	}
	for name, bad := range map[string]any{
		"version":   []any{2, "e1", 0, 8, 7, "cut", 3},
		"short":     []any{1, "e1", 0, 8},
		"resume":    []any{1, "e1", 0, 9, 7, "cut", 3},
		"negative":  []any{1, "e1", 0, -1, 7, "cut", 3},
		"not_array": map[string]any{"version": 1},
	} {
		if _, err := decodeSnapshotHeader(mustPack(t, bad)); err == nil {
			t.Errorf("%s: header accepted", name)
		}
	}
	hs, err := decodeSnapshotChunk(mustPack(t, []any{[]any{nil, []any{-1}}, []any{int64(-1), []any{5, 6}}}), nil, 10)
	if err != nil || len(hs) != 3 || hs[0] != 0xffffffffffffffff || hs[2] != 6 {
		t.Fatalf("chunk %v %v", hs, err)
	}
	if _, err := decodeSnapshotChunk(mustPack(t, []any{[]any{nil, []any{1, 2, 3}}}), nil, 2); err == nil ||
		!strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("record limit: %v", err)
	}
	if _, err := decodeSnapshotChunk(mustPack(t, []any{[]any{nil}}), nil, 10); err == nil {
		t.Fatal("record without hashes accepted")
	}
}

// Issue 35: an engine's snapshot error reply of 32 MiB became one 32 MB log
// line per attempt. What the engine says goes into errors and logs quoted
// and cut to maxPeerText bytes, with its length.
func TestPeerTextBounded(t *testing.T) {
	if got := peerText([]byte("busy\n")); got != `"busy\n"` {
		t.Errorf("short text: %s", got)
	}
	huge := make([]byte, 32<<20)
	for i := range huge {
		huge[i] = 'x'
	}
	got := peerText(huge)
	if len(got) > maxPeerText+40 || !strings.HasSuffix(got, "... (33554432 bytes)") {
		t.Errorf("32 MiB text: %d bytes, ends %q", len(got), got[max(0, len(got)-30):])
	}
}
