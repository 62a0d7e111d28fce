package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/vmihailenco/msgpack/v5"
)

// sampleBatch exercises every field the encoders write.
func sampleBatch() *event.Batch {
	return &event.Batch{
		DPRank:    1,
		Timestamp: 1234.5,
		Events: []event.Event{
			{Kind: event.BlockStored, BlockHashes: []uint64{3236607068019569386, 0xfedcba9876543210, 1},
				ParentHash: 0x8000000000000000, HasParent: true, TokenIDs: []uint32{1, 2, 3, 70000, 1 << 31, 0xffffffff},
				BlockSize: 2, LoraID: 7, HasLoraID: true, LoraName: "sql-lora", Medium: event.TierCPU,
				ExtraKeys: [][]any{{"sql-lora", int64(5), []byte{0xde, 0xad}, []any{"img-1", int64(3)}, true, nil}, nil, {"salt"}},
				GroupIdx:  2, GroupKind: event.GroupSlidingWindow, SlidingWindow: 128, Ownership: "pod-b"},
			{Kind: event.BlockStored, BlockHashes: []uint64{43}, TokenIDs: []uint32{9, 9}, BlockSize: 2, Medium: event.TierExternal,
				GroupKind: event.GroupFullAttention, Remote: true},
			{Kind: event.BlockStored, BlockHashes: []uint64{42}, TokenIDs: []uint32{9, 9}, BlockSize: 2, Medium: event.TierGPU},
			{Kind: event.BlockRemoved, BlockHashes: []uint64{0xfedcba9876543210, 5}, Medium: event.TierDisk, GroupIdx: 1,
				RemainingCopies: []uint32{1, 0}, HasRemainingCopies: true},
			{Kind: event.BlockRemoved, BlockHashes: []uint64{6}, Medium: event.TierGPU},
			{Kind: event.AllBlocksCleared},
		},
	}
}

func mustDecode(t *testing.T, payload []byte, engine blockkeys.Engine) (*event.Batch, DecodeStats) {
	t.Helper()
	var b event.Batch
	st, err := Decode(payload, engine, &b)
	if err != nil {
		t.Fatalf("Decode: %v (payload %x)", err, payload)
	}
	return &b, st
}

func TestDecodeVLLMRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  enginepub.VLLMEncodeOptions
	}{
		{"array_int", enginepub.VLLMEncodeOptions{}},
		{"map_int", enginepub.VLLMEncodeOptions{MapForm: true}},
		{"array_bytes32", enginepub.VLLMEncodeOptions{BytesHashes: true}},
		{"map_bytes16", enginepub.VLLMEncodeOptions{MapForm: true, BytesHashes: true, HashBytesLen: 16}},
		{"array_bytes64", enginepub.VLLMEncodeOptions{BytesHashes: true, HashBytesLen: 64}},
		{"map_batch", enginepub.VLLMEncodeOptions{MapForm: true, MapBatch: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := sampleBatch()
			p, err := enginepub.EncodeVLLMBatch(want, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			got, st := mustDecode(t, p, blockkeys.EngineVLLM)
			if st.EventErrors != 0 || !st.HasDPRank {
				t.Fatalf("stats %+v", st)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
			}
		})
	}
	t.Run("two_element_batch", func(t *testing.T) {
		want := sampleBatch()
		p, _ := enginepub.EncodeVLLMBatch(want, enginepub.VLLMEncodeOptions{OmitDPRank: true})
		got, st := mustDecode(t, p, blockkeys.EngineVLLM)
		want.DPRank = 0
		if st.HasDPRank || !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v (stats %+v)", got, st)
		}
	})
}

func TestDecodeSGLangRoundTrip(t *testing.T) {
	want := &event.Batch{DPRank: 3, Timestamp: 1, Events: []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{0xffffffffffffffff, 0x8000000000000001, 12},
			ParentHash: 0xabcdef0123456789, HasParent: true, TokenIDs: []uint32{1, 2, 3, 4, 5, 6}, BlockSize: 2,
			Medium: event.TierGPU, CacheSalt: "tenant-7"},
		{Kind: event.BlockStored, BlockHashes: []uint64{13}, TokenIDs: []uint32{7, 8}, BlockSize: 2, LoraID: 3, HasLoraID: true, Medium: event.TierCPU},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{0x8000000000000001}, Medium: event.TierGPU},
		{Kind: event.AllBlocksCleared},
	}}
	p, err := enginepub.EncodeSGLangBatch(want)
	if err != nil {
		t.Fatal(err)
	}
	// The wire really carries negative int64s for hashes with the top bit set.
	if !bytes.Contains(p, []byte{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 1}) {
		t.Fatalf("expected a signed int64 hash on the wire: %x", p)
	}
	got, _ := mustDecode(t, p, blockkeys.EngineSGLang)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
}

// encodeWith builds a payload by hand so tests control every msgpack width.
func encodeWith(t *testing.T, f func(e *msgpack.Encoder) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f(msgpack.NewEncoder(&buf)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeHashIntWidths(t *testing.T) {
	type enc func(e *msgpack.Encoder) error
	cases := []struct {
		name string
		put  enc
		want uint64
	}{
		{"fixint", func(e *msgpack.Encoder) error { return e.EncodeUint(7) }, 7},
		{"neg_fixint", func(e *msgpack.Encoder) error { return e.EncodeInt(-3) }, 0xfffffffffffffffd},
		{"uint8", func(e *msgpack.Encoder) error { return e.EncodeUint8(200) }, 200},
		{"uint16", func(e *msgpack.Encoder) error { return e.EncodeUint16(60000) }, 60000},
		{"uint32", func(e *msgpack.Encoder) error { return e.EncodeUint32(4000000000) }, 4000000000},
		{"uint64_small", func(e *msgpack.Encoder) error { return e.EncodeUint64(5) }, 5},
		// spec test vector: block 0 of tokens 1..16, sha256_cbor, seed "0"
		{"uint64_spec_vector", func(e *msgpack.Encoder) error { return e.EncodeUint64(3236607068019569386) }, 3236607068019569386},
		{"uint64_high_bit", func(e *msgpack.Encoder) error { return e.EncodeUint64(0xcf00000000000001) }, 0xcf00000000000001},
		{"int8", func(e *msgpack.Encoder) error { return e.EncodeInt8(-1) }, 0xffffffffffffffff},
		{"int8_pos", func(e *msgpack.Encoder) error { return e.EncodeInt8(100) }, 100},
		{"int16", func(e *msgpack.Encoder) error { return e.EncodeInt16(-300) }, uint64(0xfffffffffffffed4)},
		{"int32", func(e *msgpack.Encoder) error { return e.EncodeInt32(-70000) }, uint64(0xfffffffffffeee90)},
		{"int64_neg", func(e *msgpack.Encoder) error { return e.EncodeInt64(-0x7fffffffffffffff) }, 0x8000000000000001},
		{"int64_pos", func(e *msgpack.Encoder) error { return e.EncodeInt64(0x1234567890) }, 0x1234567890},
		{"bytes_spec_digest", func(e *msgpack.Encoder) error {
			d, _ := hex.DecodeString("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")
			return e.EncodeBytes(d)
		}, 3236607068019569386},
		{"bytes_short", func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte{1, 2}) }, 0x0102},
	}
	for _, engine := range []blockkeys.Engine{blockkeys.EngineVLLM, blockkeys.EngineSGLang} {
		for _, tc := range cases {
			t.Run(engine.String()+"/"+tc.name, func(t *testing.T) {
				if engine == blockkeys.EngineSGLang && tc.name == "bytes_spec_digest" {
					t.Skip("SGLang reduces bytes to their first 8 bytes; covered below")
				}
				p := encodeWith(t, func(e *msgpack.Encoder) error {
					e.EncodeArrayLen(3)
					e.EncodeFloat64(0)
					e.EncodeArrayLen(1)
					e.EncodeArrayLen(3)
					e.EncodeString("BlockRemoved")
					e.EncodeArrayLen(1)
					if err := tc.put(e); err != nil {
						return err
					}
					e.EncodeNil()
					return e.EncodeNil()
				})
				got, _ := mustDecode(t, p, engine)
				if len(got.Events) != 1 || got.Events[0].BlockHashes[0] != tc.want {
					t.Fatalf("got %+v, want hash %#x", got.Events, tc.want)
				}
			})
		}
	}
	d, _ := hex.DecodeString("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")
	if v, _ := normaliseHashBytes(d, blockkeys.EngineSGLang); v != 0x202da172482d928b {
		t.Fatalf("sglang bytes: %#x", v)
	}
}

func TestDecodeFieldVariants(t *testing.T) {
	// Short arrays (older vLLM, msgspec omit_defaults), extra trailing fields
	// (newer vLLM: kv_cache_spec_kind, sliding window, ...), media spellings,
	// a map event with its type key last and unknown keys.
	p := encodeWith(t, func(e *msgpack.Encoder) error {
		e.EncodeArrayLen(4)
		e.EncodeFloat32(2.5)
		e.EncodeArrayLen(5)
		// 1: minimal BlockStored (no lora_id/medium/...) -> GPU
		e.Encode([]any{"BlockStored", []uint64{1}, nil, []int{5, 6}, 2})
		// 2: every field plus unknown trailing ones
		e.Encode([]any{"BlockStored", []uint64{2}, uint64(1), []int{7, 8}, 2, nil, "cpu_pinned", nil, nil, nil,
			"sliding_window", 4096, map[string]any{"x": 1}, "session"})
		// 3: map form, type last, unknown keys, medium OBJ
		e.EncodeMapLen(5)
		e.EncodeString("block_hashes")
		e.Encode([]uint64{3, 4})
		e.EncodeString("kv_cache_spec_kind")
		e.EncodeString("full_attention")
		e.EncodeString("medium")
		e.EncodeString("obj")
		e.EncodeString("group_idx")
		e.EncodeInt(3)
		e.EncodeString("type")
		e.EncodeString("BlockRemoved")
		// 4: BlockRemoved without medium, with FS medium via trailing fields
		e.Encode([]any{"BlockRemoved", []uint64{9}, "FS", 1, "locality", "ownership"})
		// 5: AllBlocksCleared with stray fields
		e.Encode([]any{"AllBlocksCleared", 1, 2})
		e.EncodeNil() // dp rank nil
		return e.EncodeString("future-field")
	})
	got, st := mustDecode(t, p, blockkeys.EngineVLLM)
	// position 12 (locality) holds a map: skipped and counted
	if st.EventErrors != 0 || st.HasDPRank || got.Timestamp != 2.5 || st.IgnoredFields != 1 || st.FirstIgnored != "locality" {
		t.Fatalf("stats %+v ts %v", st, got.Timestamp)
	}
	want := []event.Event{
		{Kind: event.BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{5, 6}, BlockSize: 2},
		{Kind: event.BlockStored, BlockHashes: []uint64{2}, ParentHash: 1, HasParent: true, TokenIDs: []uint32{7, 8}, BlockSize: 2,
			Medium: event.TierCPU, GroupKind: event.GroupSlidingWindow, SlidingWindow: 4096, Ownership: "session"},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{3, 4}, Medium: event.TierExternal, GroupIdx: 3, GroupKind: event.GroupFullAttention},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{9}, Medium: event.TierDisk, GroupIdx: 1, Ownership: "ownership"},
		{Kind: event.AllBlocksCleared},
	}
	if !reflect.DeepEqual(got.Events, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got.Events, want)
	}
}

func TestDecodeMalformedEventDropsOnlyThatEvent(t *testing.T) {
	bad := map[string]any{
		"float_hash":       []any{"BlockRemoved", []any{1.5}},
		"nil_hash":         []any{"BlockRemoved", []any{nil}},
		"empty_bytes_hash": []any{"BlockRemoved", []any{[]byte{}}},
		"unknown_type":     []any{"BlockTeleported", []uint64{1}},
		"empty_array":      []any{},
		"tag_not_string":   []any{7, []uint64{1}},
		"not_array_or_map": "BlockStored",
		"map_without_type": map[string]any{"block_hashes": []uint64{1}},
	}
	for name, ev := range bad {
		t.Run(name, func(t *testing.T) {
			p := encodeWith(t, func(e *msgpack.Encoder) error {
				e.EncodeArrayLen(3)
				e.EncodeFloat64(0)
				e.EncodeArrayLen(3)
				e.Encode([]any{"BlockStored", []uint64{10}, nil, []int{1}, 1})
				e.Encode(ev)
				e.Encode([]any{"BlockRemoved", []uint64{11}})
				return e.EncodeInt(2)
			})
			got, st := mustDecode(t, p, blockkeys.EngineVLLM)
			if st.EventErrors != 1 || st.FirstEventError == nil {
				t.Fatalf("stats %+v", st)
			}
			var ee *EventError
			if !errors.As(st.FirstEventError, &ee) || ee.Index != 1 {
				t.Fatalf("first error %v", st.FirstEventError)
			}
			if len(got.Events) != 2 || got.Events[0].BlockHashes[0] != 10 || got.Events[1].BlockHashes[0] != 11 || got.DPRank != 2 {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

// An optional field that cannot be interpreted never drops a block: the
// event is kept, the field skipped and counted, and what hashing needed is
// marked so the applier indexes the block under the engine's hash.
func TestDecodeOptionalFieldsNeverDropBlocks(t *testing.T) {
	opaque := func(what string) [][]any { return [][]any{{event.OpaqueExtraKey{What: what}}} }
	for _, tc := range []struct {
		name    string
		ev      any
		ignored string
		check   func(ev event.Event) bool
	}{
		{"negative_token", []any{"BlockStored", []uint64{1}, nil, []int{1, -2}, 2}, "token_ids",
			func(ev event.Event) bool { return ev.TokenIDs == nil && ev.BlockSize == 2 }},
		{"token_too_big", []any{"BlockStored", []uint64{1}, nil, []uint64{1 << 32}, 1}, "token_ids",
			func(ev event.Event) bool { return ev.TokenIDs == nil }},
		{"medium_int", []any{"BlockRemoved", []uint64{1}, 5}, "medium",
			func(ev event.Event) bool { return ev.Medium == event.TierExternal }},
		{"group_negative", []any{"BlockRemoved", []uint64{1}, nil, -1}, "group_idx",
			func(ev event.Event) bool { return ev.GroupIdx == 0 }},
		{"lora_id_str", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, "x"}, "lora_id",
			func(ev event.Event) bool { return !ev.HasLoraID }},
		{"block_size_neg", []any{"BlockStored", []uint64{1}, nil, []int{1}, -16}, "block_size",
			func(ev event.Event) bool { return ev.BlockSize == 0 }},
		{"lora_name_int", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, nil, nil, 7}, "lora_name",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, opaque("extra_keys")) }},
		{"extra_keys_str", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, nil, nil, nil, "x"}, "extra_keys",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, opaque("extra_keys")) }},
		{"deep_extra_keys", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, nil, nil, nil, []any{deepList(40)}}, "extra_keys",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, opaque("extra_keys")) }},
		{"extra_keys_float", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, nil, nil, nil, []any{[]any{1.5}}}, "",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, opaque("float")) }},
		{"extra_keys_flat", []any{"BlockStored", []uint64{1}, nil, []int{1}, 1, nil, nil, nil, []any{"x"}}, "",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, opaque("extra_keys entry")) }},
		{"sglang_extra_keys", []any{"BlockStored", []int64{1}, nil, []int{1}, 1, nil, "GPU", []any{[]any{"salt-1"}}}, "",
			func(ev event.Event) bool { return reflect.DeepEqual(ev.ExtraKeys, [][]any{{"salt-1"}}) }},
		{"copies_str", map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{1}, "remaining_copy_counts": "x"}, "remaining_copy_counts",
			func(ev event.Event) bool { return !ev.HasRemainingCopies }},
		{"spec_kind_int", map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "kv_cache_spec_kind": 3}, "kv_cache_spec_kind",
			func(ev event.Event) bool { return ev.GroupKind == event.GroupKindUnknown }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := encodeWith(t, func(e *msgpack.Encoder) error {
				e.EncodeArrayLen(3)
				e.EncodeFloat64(0)
				e.EncodeArrayLen(1)
				e.Encode(tc.ev)
				return e.EncodeInt(0)
			})
			got, st := mustDecode(t, p, blockkeys.EngineVLLM)
			if st.EventErrors != 0 || len(got.Events) != 1 || got.Events[0].BlockHashes[0] != 1 {
				t.Fatalf("stats %+v events %+v", st, got.Events)
			}
			if (tc.ignored != "") != (st.IgnoredFields == 1) || st.FirstIgnored != tc.ignored {
				t.Fatalf("ignored %d %q, want %q", st.IgnoredFields, st.FirstIgnored, tc.ignored)
			}
			if !tc.check(got.Events[0]) {
				t.Fatalf("event %+v", got.Events[0])
			}
		})
	}
}

func deepList(n int) any {
	var v any = "x"
	for i := 0; i < n; i++ {
		v = []any{v}
	}
	return v
}

func TestDecodeMalformedBatch(t *testing.T) {
	good, _ := enginepub.EncodeVLLMBatch(sampleBatch(), enginepub.VLLMEncodeOptions{})
	cases := map[string][]byte{
		"empty":          {},
		"not_array":      {0xa1, 'x'},
		"one_element":    encodeWith(t, func(e *msgpack.Encoder) error { return e.Encode([]any{1.0}) }),
		"events_not_arr": encodeWith(t, func(e *msgpack.Encoder) error { return e.Encode([]any{1.0, "x", 0}) }),
		"ts_string":      encodeWith(t, func(e *msgpack.Encoder) error { return e.Encode([]any{"now", []any{}, 0}) }),
		"rank_negative":  encodeWith(t, func(e *msgpack.Encoder) error { return e.Encode([]any{1.0, []any{}, -1}) }),
		"truncated":      good[:len(good)-3],
		"trailing":       append(append([]byte{}, good...), 0x01),
		"huge_array_len": {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"map_no_events":  encodeWith(t, func(e *msgpack.Encoder) error { return e.Encode(map[string]any{"ts": 1.0}) }),
		"reserved_code":  {0x92, 0xc1, 0x90},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			var b event.Batch
			_, err := Decode(p, blockkeys.EngineVLLM, &b)
			var be *BatchError
			if !errors.As(err, &be) {
				t.Fatalf("want BatchError, got %v", err)
			}
		})
	}
}

// Every prefix of a valid payload must fail cleanly, never panic.
func TestDecodeEveryTruncation(t *testing.T) {
	for _, form := range []enginepub.VLLMEncodeOptions{{}, {MapForm: true, BytesHashes: true}} {
		p, _ := enginepub.EncodeVLLMBatch(sampleBatch(), form)
		for i := 0; i < len(p); i++ {
			var b event.Batch
			if _, err := Decode(p[:i], blockkeys.EngineVLLM, &b); err == nil {
				t.Fatalf("prefix %d of %d decoded without error", i, len(p))
			}
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, opt := range []enginepub.VLLMEncodeOptions{{}, {MapForm: true}, {BytesHashes: true}} {
		p, _ := enginepub.EncodeVLLMBatch(sampleBatch(), opt)
		f.Add(p)
	}
	p, _ := enginepub.EncodeSGLangBatch(sampleBatch())
	f.Add(p)
	f.Fuzz(func(t *testing.T, data []byte) {
		var b event.Batch
		_, _ = Decode(data, blockkeys.EngineVLLM, &b)
		_, _ = Decode(data, blockkeys.EngineSGLang, &b)
		// the snapshot replies are msgpack from the engine too
		_, _ = decodeSnapshotHeader(data)
		_, _ = decodeSnapshotChunk(data, nil, 1<<10)
	})
}

func TestParseTopic(t *testing.T) {
	for _, tc := range []struct{ topic, pod, model string }{
		{"kv@pod-a@meta-llama/Llama-3.1-8B", "pod-a", "meta-llama/Llama-3.1-8B"},
		{"kv@10.0.0.7:8000@org/m@v2", "10.0.0.7:8000", "org/m@v2"},
		{"kv@pod-b", "pod-b", ""},
		{"kv@", "", ""},
		{"plain", "", ""},
	} {
		p, m := parseTopic([]byte(tc.topic))
		if string(p) != tc.pod || string(m) != tc.model {
			t.Errorf("%q: got (%q, %q) want (%q, %q)", tc.topic, p, m, tc.pod, tc.model)
		}
	}
}

// TestDecodeEvictionSweepAllocs: one-block BlockRemoved events (an engine's
// eviction sweep, one event per block) share the message's hash arena, so
// decoding them allocates per 64 events, not per event (per block).
func TestDecodeEvictionSweepAllocs(t *testing.T) {
	b := &event.Batch{Timestamp: 1}
	for i := 0; i < 256; i++ {
		b.Events = append(b.Events, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{uint64(i) << 40}, Medium: event.TierGPU})
	}
	p, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{MapForm: true})
	if err != nil {
		t.Fatal(err)
	}
	var out event.Batch
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := Decode(p, blockkeys.EngineVLLM, &out); err != nil {
			t.Fatal(err)
		}
	})
	if len(out.Events) != 256 || out.Events[255].BlockHashes[0] != 255<<40 || out.Events[0].BlockHashes[0] != 0 {
		t.Fatalf("decoded %d events, last %v", len(out.Events), out.Events[len(out.Events)-1].BlockHashes)
	}
	if allocs > 256/hashArenaChunk+2 {
		t.Errorf("%v allocations for 256 one-block events, want at most %d", allocs, 256/hashArenaChunk+2)
	}
}
