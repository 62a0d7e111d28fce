package kvevents

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/vmihailenco/msgpack/v5"
)

// vLLM's GPU BlockStored with session_id (PR #51381), in the map form vLLM
// sends (msgspec tag=True, omit_defaults), beside keys kvindex does not
// know (event_version) or only carries (ownership): the session is
// decoded, unknown keys skipped without a count; an overlong or non-string
// session_id is skipped and counted, never fatal.
func TestDecodeBlockStoredSessionID(t *testing.T) {
	long := strings.Repeat("s", event.MaxSessionIDLen+1)
	p := encodeWith(t, func(e *msgpack.Encoder) error {
		e.EncodeArrayLen(2)
		e.EncodeFloat64(1)
		return e.Encode([]any{
			map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "parent_block_hash": nil,
				"token_ids": []int{5, 6}, "block_size": 2, "medium": "GPU", "session_id": "sess-1",
				"event_version": 2, "ownership": "tier-2"},
			map[string]any{"type": "BlockStored", "block_hashes": []uint64{2}, "parent_block_hash": nil,
				"token_ids": []int{7, 8}, "block_size": 2, "session_id": long},
			map[string]any{"type": "BlockStored", "block_hashes": []uint64{3}, "parent_block_hash": nil,
				"token_ids": []int{9, 10}, "block_size": 2, "session_id": 42},
			map[string]any{"type": "BlockStored", "block_hashes": []uint64{4}, "parent_block_hash": nil,
				"token_ids": []int{11, 12}, "block_size": 2, "session_id": nil},
		})
	})
	got, st := mustDecode(t, p, blockkeys.EngineVLLM)
	if st.EventErrors != 0 || st.IgnoredFields != 2 || st.FirstIgnored != "session_id" {
		t.Fatalf("stats %+v", st)
	}
	want := []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{5, 6}, BlockSize: 2, SessionID: "sess-1", Ownership: "tier-2"},
		{Kind: event.BlockStored, BlockHashes: []uint64{2}, TokenIDs: []uint32{7, 8}, BlockSize: 2},
		{Kind: event.BlockStored, BlockHashes: []uint64{3}, TokenIDs: []uint32{9, 10}, BlockSize: 2},
		{Kind: event.BlockStored, BlockHashes: []uint64{4}, TokenIDs: []uint32{11, 12}, BlockSize: 2},
	}
	if !reflect.DeepEqual(got.Events, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got.Events, want)
	}
}

// The test publisher's vLLM encoder writes session_id in the map form, as
// vLLM does, and refuses it in the array form, whose position vLLM does
// not publish: what it sends decodes to the session it was given.
func TestTestPublisherSessionIDRoundTrip(t *testing.T) {
	ev := event.Event{Kind: event.BlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2, SessionID: "sess-9"}
	b := &event.Batch{Timestamp: 1, Events: []event.Event{ev}}
	if _, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{}); err == nil {
		t.Fatal("a session_id in the array form was encoded")
	}
	p, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{MapForm: true})
	if err != nil {
		t.Fatal(err)
	}
	got, st := mustDecode(t, p, blockkeys.EngineVLLM)
	if st.EventErrors != 0 || len(got.Events) != 1 || got.Events[0].SessionID != "sess-9" {
		t.Fatalf("decoded %+v, stats %+v", got.Events, st)
	}
}
