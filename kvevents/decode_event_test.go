package kvevents

import (
	"encoding/binary"
	"math"
	"reflect"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Edges of event decoding: each test pins one value the decoder must keep exactly, and that an
// optional field read cleanly is not counted as ignored.

// mpStr encodes a fixstr (test strings are < 32 bytes).
func mpStr(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }

// mpMap encodes a fixmap of the key/value pairs given (already encoded).
func mpMap(kv ...[]byte) []byte {
	p := []byte{0x80 | byte(len(kv)/2)}
	for _, x := range kv {
		p = append(p, x...)
	}
	return p
}

// storedWithTuple is ["BlockStored", [5], nil, [1], 1, nil, nil, nil,
// [tuple]]: one block whose extra-keys tuple is given encoded.
func storedWithTuple(tuple []byte) []byte {
	p := append([]byte{0x99, 0xab}, "BlockStored"...)
	p = append(p, 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0, 0xc0, 0x91)
	return append(p, tuple...)
}

// decodeTuple decodes a one-element extra-keys tuple holding elem and
// returns its value; the field must be read cleanly (not ignored).
func decodeTuple(t *testing.T, elems ...[]byte) []any {
	t.Helper()
	tuple := []byte{0x90 | byte(len(elems))}
	for _, e := range elems {
		tuple = append(tuple, e...)
	}
	got, st := mustDecode(t, batchOf(storedWithTuple(tuple), encodeValue(t, []any{"BlockRemoved", []uint64{6}})), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || st.IgnoredFields != 0 || len(got.Events) != 2 || len(got.Events[0].ExtraKeys) != 1 {
		t.Fatalf("tuple %x: events %+v stats %+v", tuple, got.Events, st)
	}
	return got.Events[0].ExtraKeys[0]
}

func u64(code byte, v uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{code}, v)
}

// An event array longer than its known positions (a newer engine's extra
// fields) is read to its end: the extra fields are skipped, never indexed
// into the position table.
func TestDecodeEventLongerThanKnownFields(t *testing.T) {
	stored := []any{"BlockStored", []uint64{5}, nil, []uint32{1}, 1}
	for len(stored) < len(storedFields)+2 {
		stored = append(stored, nil)
	}
	removed := []any{"BlockRemoved", []uint64{6}}
	for len(removed) < len(removedFields)+2 {
		removed = append(removed, nil)
	}
	got, st := mustDecode(t, batchOf(encodeValue(t, stored), encodeValue(t, removed)), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || len(got.Events) != 2 || got.Events[0].BlockHashes[0] != 5 || got.Events[1].BlockHashes[0] != 6 {
		t.Fatalf("events %+v stats %+v", got.Events, st)
	}
}

// block_size / group_idx 0 and remaining copy counts up to 2^32-1 are valid
// values, not skipped ones.
func TestDecodeRangeEndsAreValid(t *testing.T) {
	// ["BlockStored", [5], nil, [1], 0]
	got, st := mustDecode(t, batchOf([]byte{0x95, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 5, 0xc0, 0x91, 1, 0x00}), blockkeys.EngineVLLM)
	if st.IgnoredFields != 0 || len(got.Events) != 1 || got.Events[0].BlockSize != 0 {
		t.Fatalf("block_size 0: %+v %+v", got.Events, st)
	}
	// ["BlockRemoved", [6], nil, 0, [2^32-1, 0]]
	p := append([]byte{0x95, 0xac}, "BlockRemoved"...)
	p = append(p, 0x91, 6, 0xc0, 0x00, 0x92, 0xce, 0xff, 0xff, 0xff, 0xff, 0x00)
	got, st = mustDecode(t, batchOf(p), blockkeys.EngineVLLM)
	if st.IgnoredFields != 0 || len(got.Events) != 1 {
		t.Fatalf("copies: %+v %+v", got.Events, st)
	}
	if e := got.Events[0]; e.GroupIdx != 0 || !e.HasRemainingCopies || !reflect.DeepEqual(e.RemainingCopies, []uint32{math.MaxUint32, 0}) {
		t.Fatalf("removed %+v", e)
	}
	// one past: skipped and counted
	p = append([]byte{0x95, 0xac}, "BlockRemoved"...)
	p = append(p, 0x91, 6, 0xc0, 0x00, 0x91)
	p = append(p, u64(0xcf, math.MaxUint32+1)...)
	got, st = mustDecode(t, batchOf(p), blockkeys.EngineVLLM)
	if st.IgnoredFields != 1 || len(got.Events) != 1 || got.Events[0].HasRemainingCopies {
		t.Fatalf("copy count 2^32: %+v %+v", got.Events, st)
	}
}

// SGLang EAGLE bigram token ids: each position a pair, both kept, in order.
func TestDecodeBigramTokens(t *testing.T) {
	ev := encodeValue(t, []any{"BlockStored", []uint64{5}, nil, [][]uint32{{1, 2}, {3, 70000}, {70000, 4}}, 3})
	got, st := mustDecode(t, batchOf(ev), blockkeys.EngineSGLang)
	if st.IgnoredFields != 0 || len(got.Events) != 1 {
		t.Fatalf("%+v %+v", got.Events, st)
	}
	if e := got.Events[0]; !e.Bigram || !reflect.DeepEqual(e.TokenIDs, []uint32{1, 2, 3, 70000, 70000, 4}) || e.BlockSize != 3 {
		t.Fatalf("event %+v", e)
	}
	// Pairs and plain ids in one array: token_ids skipped, the block kept.
	ev = encodeValue(t, []any{"BlockStored", []uint64{5}, nil, []any{[]uint32{1, 2}, uint32(3)}, 2})
	got, st = mustDecode(t, batchOf(ev), blockkeys.EngineSGLang)
	if st.IgnoredFields != 1 || st.FirstIgnored != "token_ids" || len(got.Events) != 1 {
		t.Fatalf("mixed: %+v %+v", got.Events, st)
	}
	ev = encodeValue(t, []any{"BlockStored", []uint64{5}, nil, []any{uint32(3), []uint32{1, 2}}, 2})
	got, st = mustDecode(t, batchOf(ev), blockkeys.EngineSGLang)
	if st.IgnoredFields != 1 || st.FirstIgnored != "token_ids" || len(got.Events) != 1 {
		t.Fatalf("mixed, pair second: %+v %+v", got.Events, st)
	}
	// A pair of three is not a bigram: token_ids skipped, the block kept.
	ev = encodeValue(t, []any{"BlockStored", []uint64{5}, nil, [][]uint32{{1, 2, 3}}, 3})
	got, st = mustDecode(t, batchOf(ev), blockkeys.EngineSGLang)
	if st.IgnoredFields != 1 || st.FirstIgnored != "token_ids" || len(got.Events) != 1 || got.Events[0].BlockSize != 3 {
		t.Fatalf("triple: %+v %+v", got.Events, st)
	}
}

// Extra-key tuples nest up to maxDepth levels below the tuple itself: a
// string at depth maxDepth is read, one deeper is past the limit.
func TestDecodeExtraKeysDepthExact(t *testing.T) {
	got := decodeTuple(t, nested(maxDepth-1))
	v := got[0]
	for i := 0; i < maxDepth-1; i++ {
		l, ok := v.([]any)
		if !ok || len(l) != 1 {
			t.Fatalf("level %d: %#v", i, v)
		}
		v = l[0]
	}
	if v != "x" {
		t.Fatalf("innermost %#v", v)
	}
}

// Integers in extra keys are vLLM's Python ints: a uint64 above int64 is
// opaque, anything else (any width) its int64 value.
func TestDecodeExtraKeyIntegers(t *testing.T) {
	got := decodeTuple(t,
		u64(0xcf, math.MaxInt64+1),
		u64(0xcf, math.MaxInt64),
		u64(0xcf, 5),
		u64(0xd3, math.MaxUint64), // int64 -1
		[]byte{0xff},              // fixint -1
	)
	want := []any{event.OpaqueExtraKey{What: "uint64"}, int64(math.MaxInt64), int64(5), int64(-1), int64(-1)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

// Floats and extension types are opaque, and say which they were.
func TestDecodeExtraKeyOpaqueKinds(t *testing.T) {
	got := decodeTuple(t,
		[]byte{0xca, 0x3f, 0x80, 0, 0},
		u64(0xcb, math.Float64bits(1.5)),
		[]byte{0xd4, 0x01, 0x02},
		mpStr("after"),
	)
	want := []any{event.OpaqueExtraKey{What: "float"}, event.OpaqueExtraKey{What: "float"},
		event.OpaqueExtraKey{What: "msgpack type 0xd4"}, "after"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

// Typed extra keys (maps) in any key order, read exactly to their end, and
// unknown or untyped maps opaque under their tag.
func TestDecodeExtraKeyTaggedMaps(t *testing.T) {
	got := decodeTuple(t,
		mpMap(mpStr("name"), mpStr("sql"), mpStr("type"), mpStr("lora")),
		mpMap(mpStr("type"), mpStr("cache_salt"), mpStr("salt"), mpStr("s1")),
		mpMap(mpStr("type"), mpStr("mm"), mpStr("hash"), mpStr("img"), mpStr("block_offset"), []byte{0x03}),
		mpMap(mpStr("value"), []byte{0x07}, mpStr("type"), mpStr("legacy")),
		mpMap(mpStr("type"), mpStr("teleport"), mpStr("x"), []byte{0x01}),
		mpMap(mpStr("k"), []byte{0x01}),
		mpMap(),
		mpStr("after"),
	)
	want := []any{"sql", "s1", []any{"img", int64(3)}, int64(7),
		event.OpaqueExtraKey{What: "extra key teleport"}, event.OpaqueExtraKey{What: "extra key map"},
		event.OpaqueExtraKey{What: "extra key map"}, "after"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

// Nesting through typed-key maps counts toward the depth limit like lists
// do: a hostile chain of maps is cut at maxDepth (the field skipped).
func TestDecodeExtraKeyMapNestingLimit(t *testing.T) {
	inner := mpStr("x")
	for i := 0; i < maxDepth+1; i++ {
		inner = mpMap(mpStr("value"), inner, mpStr("type"), mpStr("legacy"))
	}
	tuple := append([]byte{0x91}, inner...)
	got, st := mustDecode(t, batchOf(storedWithTuple(tuple), encodeValue(t, []any{"BlockRemoved", []uint64{6}})), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || st.IgnoredFields != 1 || st.FirstIgnored != "extra_keys" || len(got.Events) != 2 {
		t.Fatalf("maps nested past the limit: %+v %+v", got.Events, st)
	}
	// within the limit the legacy chain unwraps to its innermost value
	inner = mpStr("x")
	for i := 0; i < maxDepth-1; i++ {
		inner = mpMap(mpStr("value"), inner, mpStr("type"), mpStr("legacy"))
	}
	if v := decodeTuple(t, inner); !reflect.DeepEqual(v, []any{"x"}) {
		t.Fatalf("within the limit: %#v", v)
	}
}

// Issue 32: llm-d's publishers (llm-d-inference-sim pkg/kv-cache
// kv_cache_sender.go, llm-d-kv-cache kvevents) send parent_block_hash 0,
// kvblock.EmptyBlockHash, for a chain's first block in the array form: it
// is "no parent", as nil is; any other value is a parent.
func TestDecodeParentZeroIsNoParent(t *testing.T) {
	for _, c := range []struct {
		parent any
		has    bool
	}{{uint64(0), false}, {int64(0), false}, {nil, false}, {uint64(1), true}, {int64(-1), true}} {
		ev := encodeValue(t, []any{"BlockStored", []uint64{5}, c.parent, []uint32{1}, 1})
		got, st := mustDecode(t, batchOf(ev), blockkeys.EngineVLLM)
		if st.EventErrors != 0 || len(got.Events) != 1 || got.Events[0].HasParent != c.has {
			t.Errorf("parent %#v: %+v %+v", c.parent, got.Events, st)
		}
	}
}
