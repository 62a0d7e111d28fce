package kvevents

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// llm-d's storage-tier publisher packs each event as msgpack bytes holding
// the encoded event. A packed event decodes as the event it holds and is
// counted; bytes inside the bytes, trailing bytes after the packed event,
// and a packed event that does not decode drop that event only.
func TestDecodePackedEvents(t *testing.T) {
	removed := func(h uint64) []byte { return encodeValue(t, []any{"BlockRemoved", []uint64{h}}) }
	bin := func(b []byte) []byte { return encodeValue(t, b) }
	p := batchOf(
		bin(removed(7)),                // packed: kept
		removed(8),                     // plain: kept
		bin(bin(removed(9))),           // bytes in bytes
		bin(append(removed(10), 0xc0)), // a trailing nil after the event
		bin(removed(11)[:4]),           // truncated inside
		bin([]byte{}),                  // empty
		bin(removed(12)),               // packed: kept
	)
	got, st := mustDecode(t, p, blockkeys.EngineVLLM)
	var hashes []uint64
	for _, ev := range got.Events {
		if ev.Kind != event.BlockRemoved || len(ev.BlockHashes) != 1 {
			t.Fatalf("event %+v", ev)
		}
		hashes = append(hashes, ev.BlockHashes[0])
	}
	if len(hashes) != 3 || hashes[0] != 7 || hashes[1] != 8 || hashes[2] != 12 {
		t.Fatalf("kept %v, want [7 8 12]", hashes)
	}
	if st.PackedEvents != 2 || st.EventErrors != 4 {
		t.Fatalf("packed %d, event errors %d; want 2 and 4", st.PackedEvents, st.EventErrors)
	}
	var ee *EventError
	if !errors.As(st.FirstEventError, &ee) || ee.Index != 2 || !strings.Contains(ee.Error(), "holds bytes again") {
		t.Fatalf("first event error %v, want event 2's bytes in bytes", st.FirstEventError)
	}
}

// A stored block whose medium the index does not know is kept (as GPU) and
// counted once per event.
func TestDecodeCountsUnknownMedia(t *testing.T) {
	stored := func(medium string) []byte {
		return encodeValue(t, map[string]any{"type": "BlockStored", "block_hashes": []uint64{6}, "token_ids": []int{1},
			"block_size": 1, "medium": medium})
	}
	got, st := mustDecode(t, batchOf(stored("tape"), stored("GPU"), stored("punch_cards")), blockkeys.EngineVLLM)
	if len(got.Events) != 3 || st.UnknownMedia != 2 {
		t.Fatalf("%d events, unknown media %d; want 3 and 2 (stats %+v)", len(got.Events), st.UnknownMedia, st)
	}
}
