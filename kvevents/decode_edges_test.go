package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/vmihailenco/msgpack/v5"
)

// Edges of the payload decoder. Payloads are built by hand
// (or with the independent msgpack encoder) so every byte is chosen.

// batchOf wraps encoded events in a 2-element batch [ts, events]: the last
// event's last field is then the last value of the payload.
func batchOf(events ...[]byte) []byte {
	p := []byte{0x92, 0x00, 0x90 | byte(len(events))}
	for _, ev := range events {
		p = append(p, ev...)
	}
	return p
}

func encodeValue(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A map-form event whose type is unknown is dropped and counted like an
// array-form one; it must never reach the applier as a kind-0 event.
func TestDecodeMapEventOfUnknownType(t *testing.T) {
	bad := encodeWith(t, func(e *msgpack.Encoder) error {
		e.EncodeMapLen(2)
		e.EncodeString("type")
		e.EncodeString("BlockTeleported")
		e.EncodeString("block_hashes")
		return e.Encode([]uint64{1})
	})
	p := batchOf(encodeValue(t, []any{"BlockRemoved", []uint64{10}}), bad, encodeValue(t, []any{"BlockRemoved", []uint64{11}}))
	got, st := mustDecode(t, p, blockkeys.EngineVLLM)
	var ee *EventError
	if st.EventErrors != 1 || !errors.As(st.FirstEventError, &ee) || ee.Index != 1 || ee.Type != "BlockTeleported" || !errors.Is(ee, errUnknownEvent) {
		t.Fatalf("stats %+v", st)
	}
	if len(got.Events) != 2 || got.Events[0].BlockHashes[0] != 10 || got.Events[1].BlockHashes[0] != 11 {
		t.Fatalf("events %+v", got.Events)
	}
	for _, ev := range got.Events {
		if ev.Kind == 0 {
			t.Fatalf("a kind-0 event was kept: %+v", got.Events)
		}
	}
}

// Field values at their edges: nil medium is GPU (also after an earlier
// medium key of the same map: the last value wins), group_idx 255 is the
// largest representable group, cache_salt nil is no salt, SGLang's
// position-7 map may hold a nil salt.
func TestDecodeFieldEdges(t *testing.T) {
	p := encodeWith(t, func(e *msgpack.Encoder) error {
		e.EncodeArrayLen(2)
		e.EncodeFloat64(1)
		e.EncodeArrayLen(6)
		// 0: array form, medium nil, group 255
		e.Encode([]any{"BlockRemoved", []uint64{1}, nil, 255})
		// 1: map form, medium "CPU" then nil, cache_salt nil
		e.EncodeMapLen(5)
		e.EncodeString("type")
		e.EncodeString("BlockStored")
		e.EncodeString("block_hashes")
		e.Encode([]uint64{2})
		e.EncodeString("medium")
		e.EncodeString("CPU")
		e.EncodeString("medium")
		e.EncodeNil()
		e.EncodeString("cache_salt")
		e.EncodeNil()
		// 2: SGLang position 7 map with a nil salt and another key
		// (keys in this order: a nil salt first, then a key to skip)
		saltNil := append(append([]byte{0x82, 0xaa}, "cache_salt"...), 0xc0, 0xa1, 'x', 0x01)
		e.Encode([]any{"BlockStored", []uint64{3}, nil, []int{1}, 1, nil, nil, msgpack.RawMessage(saltNil)})
		// 3: group_idx 256 decodes (the applier leaves groups beyond 255 out
		// of matching; an optional field never drops an event)
		e.Encode([]any{"BlockRemoved", []uint64{4}, nil, 256})
		// 4: group_idx nil after a set value (map form): group 0
		e.EncodeMapLen(4)
		e.EncodeString("type")
		e.EncodeString("BlockRemoved")
		e.EncodeString("block_hashes")
		e.Encode([]uint64{5})
		e.EncodeString("group_idx")
		e.EncodeInt(7)
		e.EncodeString("group_idx")
		e.EncodeNil()
		// 5: cache_salt set (map form)
		return e.Encode(map[string]any{"type": "BlockStored", "block_hashes": []uint64{6}, "cache_salt": "s"})
	})
	got, st := mustDecode(t, p, blockkeys.EngineSGLang)
	if st.EventErrors != 0 {
		t.Fatalf("stats %+v, want no event dropped", st)
	}
	want := []event.Event{
		{Kind: event.BlockRemoved, BlockHashes: []uint64{1}, Medium: event.TierGPU, GroupIdx: 255},
		{Kind: event.BlockStored, BlockHashes: []uint64{2}, Medium: event.TierGPU},
		{Kind: event.BlockStored, BlockHashes: []uint64{3}, TokenIDs: []uint32{1}, BlockSize: 1},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{4}, GroupIdx: 256},
		{Kind: event.BlockRemoved, BlockHashes: []uint64{5}},
		{Kind: event.BlockStored, BlockHashes: []uint64{6}, CacheSalt: "s"},
	}
	if !reflect.DeepEqual(got.Events, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got.Events, want)
	}
}

// SGLang names the batch's rank attn_dp_rank; vLLM data_parallel_rank.
func TestDecodeBatchRankKeys(t *testing.T) {
	for _, key := range []string{"attn_dp_rank", "data_parallel_rank", "dp_rank"} {
		p := encodeValue(t, map[string]any{"ts": 1.0, "events": []any{}, key: 3})
		got, st := mustDecode(t, p, blockkeys.EngineSGLang)
		if got.DPRank != 3 || !st.HasDPRank {
			t.Errorf("%s: rank %d, stats %+v", key, got.DPRank, st)
		}
	}
	p := encodeValue(t, map[string]any{"ts": 1.0, "events": []any{}, "rank": 3})
	if got, st := mustDecode(t, p, blockkeys.EngineSGLang); got.DPRank != 0 || st.HasDPRank {
		t.Errorf("unknown key read as the rank: %d %+v", got.DPRank, st)
	}
}

// Unknown fields are skipped whatever they hold: booleans, floats and every
// ext encoding (fixext 1..16, ext 8/16/32) included.
func TestDecodeSkipsEveryUnknownValueType(t *testing.T) {
	values := map[string][]byte{
		"true":     {0xc3},
		"false":    {0xc2},
		"nil":      {0xc0},
		"float32":  {0xca, 0, 0, 0, 0},
		"float64":  {0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		"fixext1":  {0xd4, 1, 0xaa},
		"fixext2":  {0xd5, 1, 0xaa, 0xbb},
		"fixext4":  {0xd6, 1, 1, 2, 3, 4},
		"fixext8":  {0xd7, 0xff, 1, 2, 3, 4, 5, 6, 7, 8}, // type -1: msgpack timestamp
		"fixext16": append([]byte{0xd8, 1}, make([]byte, 16)...),
		"ext8":     {0xc7, 3, 5, 'a', 'b', 'c'},
		"ext16":    {0xc8, 0, 2, 5, 'a', 'b'},
		"ext32":    {0xc9, 0, 0, 0, 1, 5, 'a'},
		"int64":    {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0},
		"bin8":     {0xc4, 1, 0},
		"map":      {0x81, 0xa1, 'k', 0xc3},
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			// map form: {"type": "BlockRemoved", "zz": v, "block_hashes": [7]}
			m := []byte{0x83, 0xa4, 't', 'y', 'p', 'e', 0xac}
			m = append(m, "BlockRemoved"...)
			m = append(m, 0xa2, 'z', 'z')
			m = append(m, v...)
			m = append(m, 0xac)
			m = append(m, "block_hashes"...)
			m = append(m, 0x91, 0x07)
			// array form: ["BlockRemoved", [8], nil, nil, v]
			a := []byte{0x95, 0xac}
			a = append(a, "BlockRemoved"...)
			a = append(a, 0x91, 0x08, 0xc0, 0xc0)
			a = append(a, v...)
			got, st := mustDecode(t, batchOf(m, a), blockkeys.EngineVLLM)
			if st.EventErrors != 0 || len(got.Events) != 2 || got.Events[0].BlockHashes[0] != 7 || got.Events[1].BlockHashes[0] != 8 {
				t.Fatalf("events %+v, stats %+v", got.Events, st)
			}
		})
	}
}

// Headers are checked against the bytes left: a value that ends exactly at
// the end of the payload is whole, one that claims a byte more is truncated.
func TestDecodeHeadersAgainstRemainingBytes(t *testing.T) {
	removed := func(rest ...byte) []byte {
		p := []byte{0x93, 0xac}
		p = append(p, "BlockRemoved"...)
		p = append(p, 0x91, 0x05)
		return append(p, rest...)
	}
	exact := map[string][]byte{
		// medium "CPU": the str's bytes end the payload
		"str":  batchOf(removed(0xa3, 'C', 'P', 'U')),
		"str8": batchOf(removed(0xd9, 3, 'C', 'P', 'U')),
		// token_ids [1,2,3] as the last field: 3 elements, 3 bytes left
		"array": batchOf(append([]byte{0x94, 0xab}, append([]byte("BlockStored"), 0x91, 0x05, 0xc0, 0x93, 1, 2, 3)...)),
		// SGLang's position-7 map {"": 1}: 1 pair, 2 bytes left
		"map": batchOf(append(append([]byte{0x98, 0xab}, "BlockStored"...), 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0, 0x81, 0xa0, 1)),
	}
	for name, p := range exact {
		got, st := mustDecode(t, p, blockkeys.EngineVLLM)
		if st.EventErrors != 0 || len(got.Events) != 1 {
			t.Errorf("%s ending at the payload's end: events %+v, stats %+v", name, got.Events, st)
		}
	}
	short := map[string][]byte{
		"str":         batchOf(removed(0xa4, 'C', 'P', 'U')),
		"str8":        batchOf(removed(0xd9, 4, 'C', 'P', 'U')),
		"str32_huge":  batchOf(removed(0xdb, 0xff, 0xff, 0xff, 0xff, 'C')),
		"bin16":       batchOf(removed(0xc5, 0x01, 0x00, 'C')),
		"array":       batchOf(append([]byte{0x94, 0xab}, append([]byte("BlockStored"), 0x91, 0x05, 0xc0, 0x94, 1, 2, 3)...)),
		"array32":     batchOf(append([]byte{0x94, 0xab}, append([]byte("BlockStored"), 0x91, 0x05, 0xc0, 0xdd, 0x7f, 0xff, 0xff, 0xff, 1)...)),
		"map":         batchOf(append(append([]byte{0x98, 0xab}, "BlockStored"...), 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0, 0x82, 0xa0, 1)),
		"map32":       batchOf(append(append([]byte{0x98, 0xab}, "BlockStored"...), 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0, 0xdf, 0, 1, 0, 0, 0xa0)),
		"ext_skipped": batchOf(append(append([]byte{0x95, 0xac}, "BlockRemoved"...), 0x91, 0x05, 0xc0, 0xc0, 0xc7, 4, 1, 'a', 'b', 'c')),
	}
	for name, p := range short {
		var b event.Batch
		_, err := Decode(p, blockkeys.EngineVLLM, &b)
		var be *BatchError
		if !errors.As(err, &be) || !errors.Is(err, errTruncated) {
			t.Errorf("%s claiming more than is left: err %v, want a truncated BatchError", name, err)
		}
	}
}

// nested returns depth arrays around a str: nested(0) = "x", nested(1) = ["x"].
func nested(depth int) []byte {
	var p []byte
	for i := 0; i < depth; i++ {
		p = append(p, 0x91)
	}
	return append(p, 0xa1, 'x')
}

// Nesting limits: an extra-keys tuple (depth 0) may hold values down to
// depth maxDepth (one more level and the field is skipped and counted, the
// event kept), and skip walks maxSkipDepth levels; one more is an error (for
// skip, which cannot find the event's end, the batch). Each limit is tested
// at the limit and one level past it.
func TestDecodeNestingLimits(t *testing.T) {
	stored := func(extraTuple []byte) []byte {
		p := append([]byte{0x99, 0xab}, "BlockStored"...)
		p = append(p, 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0, 0xc0, 0x91)
		return append(p, extraTuple...)
	}
	removedLast := encodeValue(t, []any{"BlockRemoved", []uint64{6}})
	// At the limit: tuple = [nested(maxDepth-1)], the tuple at depth 0, its
	// lists at depths 1..maxDepth-1 and the str at depth maxDepth. Decoded,
	// nothing ignored.
	got, st := mustDecode(t, batchOf(stored(append([]byte{0x91}, nested(maxDepth-1)...)), removedLast), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || st.IgnoredFields != 0 || len(got.Events) != 2 {
		t.Fatalf("extra keys nested to the limit: %+v %+v", got.Events, st)
	}
	// One level past it: tuple = [nested(maxDepth)], the str at depth
	// maxDepth+1. The optional field is skipped and counted, never the
	// event: the block is indexed under the engine's hash, unverified.
	got, st = mustDecode(t, batchOf(stored(append([]byte{0x91}, nested(maxDepth)...)), removedLast), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || st.IgnoredFields != 1 || st.FirstIgnored != "extra_keys" || len(got.Events) != 2 {
		t.Fatalf("extra keys nested past the limit: %+v %+v", got.Events, st)
	}

	unknown := func(v []byte) []byte { // ["BlockRemoved", [5], nil, nil, v]
		p := append([]byte{0x95, 0xac}, "BlockRemoved"...)
		p = append(p, 0x91, 0x05, 0xc0, 0xc0)
		return append(p, v...)
	}
	// skip starts at depth 0 on the field's value: at the limit its
	// innermost array holds the str at depth maxSkipDepth, one past it at
	// maxSkipDepth+1
	got, st = mustDecode(t, batchOf(unknown(nested(maxSkipDepth)), removedLast), blockkeys.EngineVLLM)
	if st.EventErrors != 0 || len(got.Events) != 2 {
		t.Fatalf("unknown field nested to the skip limit: %+v %+v", got.Events, st)
	}
	var b event.Batch
	if _, err := Decode(batchOf(unknown(nested(maxSkipDepth+1)), removedLast), blockkeys.EngineVLLM, &b); !errors.Is(err, errTooDeep) {
		t.Fatalf("unknown field nested past the skip limit: %v", err)
	}
}

// A replay answers for the engine, not for one stream: batches of another
// DP rank and repeated sequence numbers in it must not reach this stream
// (the first would put another rank's blocks under this one, the second
// apply a batch twice).
func TestReplaySkipsOtherRanksAndDuplicates(t *testing.T) {
	const topic = "kv@pod-r@m"
	ctx := testCtx(t)
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	p := map[uint64][]byte{}
	for seq := uint64(0); seq < 5; seq++ {
		b := storedBatch(seq + 50)
		if seq == 2 {
			b.DPRank = 1
		}
		p[seq] = payload(t, b)
	}
	replay := serveReplay(t, ctx, "tcp://127.0.0.1:0", topic, p, []uint64{1, 1, 2, 3, 3})
	sink := newCollectSink()
	m := NewMetrics(nil)
	// Gap repair only: catch-up at connect would fetch the same buffer first
	// (and rightly deliver rank 1's batch to rank 1's stream).
	startSub(t, Config{DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
	pub.WaitSubscribed(ctx, topic)
	pub.Publish(topic, 0, p[0])
	pub.Publish(topic, 4, p[4])
	bs := sink.waitFor(t, "seq 4", hasSeq("pod-r", 4))
	var got []uint64
	for _, b := range bs {
		got = append(got, b.Seq)
		if b.DPRank != 0 || b.Events[0].BlockHashes[0] != b.Seq+50 {
			t.Fatalf("batch from another rank or seq delivered: %s", describe(bs))
		}
	}
	if fmt.Sprint(got) != "[0 1 3 4]" {
		t.Fatalf("seqs %v, want [0 1 3 4] (rank 1's seq 2 left out, duplicates once)", got)
	}
	if v := metricValue(m.Replays.WithLabelValues("partial")); v != 1 {
		t.Fatalf("replays{partial} = %v", v)
	}
}

// The batch's DP rank may be any int32: the largest is accepted, one more
// is a malformed batch.
func TestDecodeDPRankRange(t *testing.T) {
	p := encodeValue(t, []any{1.0, []any{}, int64(math.MaxInt32)})
	if got, st := mustDecode(t, p, blockkeys.EngineVLLM); got.DPRank != math.MaxInt32 || !st.HasDPRank {
		t.Fatalf("rank %d, stats %+v", got.DPRank, st)
	}
	var b event.Batch
	if _, err := Decode(encodeValue(t, []any{1.0, []any{}, int64(math.MaxInt32) + 1}), blockkeys.EngineVLLM, &b); err == nil {
		t.Fatal("rank 2^31 accepted")
	}
}

// A hostile event count (every remaining byte an event) must not make
// Decode reserve an Event per payload byte: it reserves at most one per
// minEventBytes bytes (the smallest event it keeps).
func TestDecodeHostileEventCountAllocation(t *testing.T) {
	const n = 200_000
	p := binary.BigEndian.AppendUint32([]byte{0x92, 0x00, 0xdd}, n)
	p = append(p, make([]byte, n)...)
	for i := 7; i < len(p); i++ {
		p[i] = 0xc0 // nil: not an event, dropped
	}
	var b event.Batch
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	st, err := Decode(p, blockkeys.EngineVLLM, &b)
	runtime.ReadMemStats(&after)
	if err != nil || st.EventErrors != n || len(b.Events) != 0 {
		t.Fatalf("err %v, stats %+v, %d events", err, st.EventErrors, len(b.Events))
	}
	got := after.TotalAlloc - before.TotalAlloc
	// the reserve, twice over, plus each dropped event's error value
	limit := 2*(uint64(len(p))/minEventBytes+2)*uint64(unsafe.Sizeof(event.Event{})) + 64*n
	t.Logf("%d-byte payload: %d bytes allocated (limit %d)", len(p), got, limit)
	if got > limit {
		t.Fatalf("decoding a %d-byte payload allocated %d bytes (%dx)", len(p), got, got/uint64(len(p)))
	}
}

// Token ids in every msgpack integer width (the fast paths cover fixint,
// uint16 and uint32 only), up to 2^32-1; block_size from 0 (not sent as
// such by some engines) to MaxInt32.
func TestDecodeTokenWidthsAndBlockSizeRange(t *testing.T) {
	tokens := []byte{0x9a, 0x05, 0xcc, 200, 0xcd, 0x01, 0x00, 0xd0, 0x07, 0xd1, 0x01, 0x02, 0xd2, 0x00, 0x01, 0x00, 0x00,
		0xd3, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xcf, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xce, 0xff, 0xff, 0xff, 0xfe,
		0x00}
	want := []uint32{5, 200, 256, 7, 258, 65536, math.MaxInt32, math.MaxUint32, math.MaxUint32 - 1, 0}
	ev := func(blockSize []byte) []byte {
		p := append([]byte{0x95, 0xab}, "BlockStored"...)
		p = append(p, 0x91, 0x05, 0xc0)
		p = append(p, tokens...)
		return append(p, blockSize...)
	}
	for _, bs := range []struct {
		enc  []byte
		want int
	}{{[]byte{0x00}, 0}, {[]byte{0xd2, 0x7f, 0xff, 0xff, 0xff}, math.MaxInt32}} {
		got, st := mustDecode(t, batchOf(ev(bs.enc)), blockkeys.EngineVLLM)
		if st.EventErrors != 0 || len(got.Events) != 1 {
			t.Fatalf("block_size %d: %+v %+v", bs.want, got.Events, st)
		}
		if e := got.Events[0]; e.BlockSize != bs.want || !reflect.DeepEqual(e.TokenIDs, want) {
			t.Fatalf("block_size %d tokens %v, want %d %v", e.BlockSize, e.TokenIDs, bs.want, want)
		}
	}
	for _, bad := range [][]byte{{0xff}, {0xd3, 0, 0, 0, 0, 0x80, 0, 0, 0}} { // -1, 2^31
		// Out of range: the optional field is skipped and counted, the
		// event kept without a block size (never a wrapped value).
		got, st := mustDecode(t, batchOf(ev(bad)), blockkeys.EngineVLLM)
		if st.EventErrors != 0 || st.IgnoredFields != 1 || len(got.Events) != 1 || got.Events[0].BlockSize != 0 {
			t.Fatalf("block_size %x: %+v %+v", bad, got.Events, st)
		}
	}
}

// SGLang's position-7 map is read to its end whatever the key order: a key
// to skip before cache_salt must not end the map early.
func TestDecodeSaltMapAnyOrder(t *testing.T) {
	m := append([]byte{0x83, 0xa1, 'x', 0x01, 0xa1, 'y', 0x91, 0x02, 0xaa}, "cache_salt"...)
	m = append(m, 0xa1, 's')
	p := append([]byte{0x98, 0xab}, "BlockStored"...)
	p = append(p, 0x91, 0x05, 0xc0, 0x91, 1, 1, 0xc0, 0xc0)
	p = append(p, m...)
	got, st := mustDecode(t, batchOf(p, encodeValue(t, []any{"BlockRemoved", []uint64{6}})), blockkeys.EngineSGLang)
	if st.EventErrors != 0 || len(got.Events) != 2 || got.Events[0].CacheSalt != "s" {
		t.Fatalf("%+v %+v", got.Events, st)
	}
}
