package enginepub

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/vmihailenco/msgpack/v5"
)

// VLLMEncodeOptions chooses which of vLLM's wire variants EncodeVLLMBatch
// produces.
type VLLMEncodeOptions struct {
	// MapForm encodes events as maps {"type": ..., field: ...} (vLLM >= 0.24)
	// instead of tagged arrays (vLLM <= 0.23).
	MapForm bool
	// BytesHashes sends hashes as msgpack bin digests (vLLM with
	// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) instead of unsigned ints. The
	// hash value becomes the LAST 8 bytes; the bytes before it are filler.
	BytesHashes bool
	// HashBytesLen is the digest length for BytesHashes (default 32; 16 is
	// xxh3-128, 64 appears on some hybrid versions).
	HashBytesLen int
	// OmitDPRank writes the 2-element batch [ts, events] of older engines.
	OmitDPRank bool
	// MapBatch writes the batch itself as a map (not seen from vLLM, but the
	// decoder tolerates it).
	MapBatch bool
}

func tierWireName(t event.Tier) string {
	switch t {
	case event.TierCPU:
		return "CPU"
	case event.TierDisk:
		return "DISK"
	case event.TierExternal:
		return "EXTERNAL"
	}
	return "GPU"
}

type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
	err error
}

func newEncoder() *encoder {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// do records the first error so the encoders read as straight-line code.
func (e *encoder) do(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

func (e *encoder) hash(h uint64, opt VLLMEncodeOptions) {
	if !opt.BytesHashes {
		e.do(e.enc.EncodeUint(h))
		return
	}
	n := opt.HashBytesLen
	if n == 0 {
		n = 32
	}
	d := make([]byte, n)
	for i := 0; i < n-8; i++ {
		d[i] = byte(0xa0 + i) // filler: decoders must ignore it
	}
	if n >= 8 {
		binary.BigEndian.PutUint64(d[n-8:], h)
	} else {
		var full [8]byte
		binary.BigEndian.PutUint64(full[:], h)
		copy(d, full[8-n:])
	}
	e.do(e.enc.EncodeBytes(d))
}

func (e *encoder) header(ts float64, n int, dpRank int, opt VLLMEncodeOptions) {
	switch {
	case opt.MapBatch:
		e.do(e.enc.EncodeMapLen(3))
		e.do(e.enc.EncodeString("ts"))
		e.do(e.enc.EncodeFloat64(ts))
		e.do(e.enc.EncodeString("data_parallel_rank"))
		e.do(e.enc.EncodeInt(int64(dpRank)))
		e.do(e.enc.EncodeString("events"))
	case opt.OmitDPRank:
		e.do(e.enc.EncodeArrayLen(2))
		e.do(e.enc.EncodeFloat64(ts))
	default:
		e.do(e.enc.EncodeArrayLen(3))
		e.do(e.enc.EncodeFloat64(ts))
	}
	e.do(e.enc.EncodeArrayLen(n))
}

// EncodeVLLMBatch encodes b as vLLM's KVEventBatch msgpack payload
// [ts, events, data_parallel_rank]. It is used by tests and the demo
// publisher; the field order follows vllm/distributed/kv_events.py.
func EncodeVLLMBatch(b *event.Batch, opt VLLMEncodeOptions) ([]byte, error) {
	e := newEncoder()
	e.header(b.Timestamp, len(b.Events), b.DPRank, opt)
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case event.BlockStored:
			// Fields after group_idx are written only when set, like
			// msgspec's omit_defaults; in array form a later field set
			// forces the earlier ones out as nil.
			tail := 0
			switch {
			case ev.Ownership != "":
				tail = 4
			case ev.Remote:
				tail = 3
			case ev.SlidingWindow != 0:
				tail = 2
			case ev.GroupKind != event.GroupKindUnknown:
				tail = 1
			}
			n := 10 + tail
			if opt.MapForm {
				n = 10 + countSet(ev.GroupKind != event.GroupKindUnknown, ev.SlidingWindow != 0, ev.Remote, ev.Ownership != "", ev.SessionID != "")
			} else if ev.SessionID != "" {
				// vLLM publishes session_id in its map form only (its
				// array position is not published): kvevents/decode.go.
				return nil, fmt.Errorf("enginepub: a session_id needs VLLMEncodeOptions.MapForm")
			}
			e.head("BlockStored", n, opt)
			e.key("block_hashes", opt)
			e.hashes(ev.BlockHashes, opt)
			e.key("parent_block_hash", opt)
			if ev.HasParent {
				e.hash(ev.ParentHash, opt)
			} else {
				e.do(e.enc.EncodeNil())
			}
			e.key("token_ids", opt)
			e.tokens(ev.TokenIDs)
			e.key("block_size", opt)
			e.do(e.enc.EncodeInt(int64(ev.BlockSize)))
			e.key("lora_id", opt)
			if ev.HasLoraID {
				e.do(e.enc.EncodeInt(ev.LoraID))
			} else {
				e.do(e.enc.EncodeNil())
			}
			e.key("medium", opt)
			e.do(e.enc.EncodeString(tierWireName(ev.Medium)))
			e.key("lora_name", opt)
			if ev.LoraName != "" {
				e.do(e.enc.EncodeString(ev.LoraName))
			} else {
				e.do(e.enc.EncodeNil())
			}
			e.key("extra_keys", opt)
			e.extraKeys(ev.ExtraKeys)
			e.key("group_idx", opt)
			e.do(e.enc.EncodeInt(int64(ev.GroupIdx)))
			e.optString("kv_cache_spec_kind", groupKindWireName(ev.GroupKind), tail >= 1, opt)
			e.optInt("kv_cache_spec_sliding_window", ev.SlidingWindow, tail >= 2, opt)
			locality := ""
			if ev.Remote {
				locality = "REMOTE"
			}
			e.optString("locality", locality, tail >= 3, opt)
			e.optString("ownership", ev.Ownership, tail >= 4, opt)
			if opt.MapForm && ev.SessionID != "" {
				e.key("session_id", opt)
				e.do(e.enc.EncodeString(ev.SessionID))
			}
		case event.BlockRemoved:
			n := 5 // the tag and four fields
			if opt.MapForm && !ev.HasRemainingCopies {
				n = 4
			}
			e.head("BlockRemoved", n, opt)
			e.key("block_hashes", opt)
			e.hashes(ev.BlockHashes, opt)
			e.key("medium", opt)
			e.do(e.enc.EncodeString(tierWireName(ev.Medium)))
			e.key("group_idx", opt)
			e.do(e.enc.EncodeInt(int64(ev.GroupIdx)))
			if !opt.MapForm || ev.HasRemainingCopies {
				e.key("remaining_copy_counts", opt)
				if ev.HasRemainingCopies {
					e.do(e.enc.EncodeArrayLen(len(ev.RemainingCopies)))
					for _, c := range ev.RemainingCopies {
						e.do(e.enc.EncodeUint(uint64(c)))
					}
				} else {
					e.do(e.enc.EncodeNil())
				}
			}
		case event.AllBlocksCleared:
			e.head("AllBlocksCleared", 1, opt)
		default:
			return nil, fmt.Errorf("enginepub: cannot encode event kind %d", ev.Kind)
		}
	}
	if !opt.OmitDPRank && !opt.MapBatch {
		e.do(e.enc.EncodeInt(int64(b.DPRank)))
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.buf.Bytes(), nil
}

func countSet(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func groupKindWireName(k event.GroupKind) string {
	if k == event.GroupKindUnknown {
		return ""
	}
	return k.String()
}

// optString writes an optional trailing field: by name when set in map
// form, by position (nil when unset) in array form while inTail.
func (e *encoder) optString(name, v string, inTail bool, opt VLLMEncodeOptions) {
	switch {
	case opt.MapForm && v != "":
		e.key(name, opt)
		e.do(e.enc.EncodeString(v))
	case !opt.MapForm && inTail && v != "":
		e.do(e.enc.EncodeString(v))
	case !opt.MapForm && inTail:
		e.do(e.enc.EncodeNil())
	}
}

func (e *encoder) optInt(name string, v int, inTail bool, opt VLLMEncodeOptions) {
	switch {
	case opt.MapForm && v != 0:
		e.key(name, opt)
		e.do(e.enc.EncodeInt(int64(v)))
	case !opt.MapForm && inTail && v != 0:
		e.do(e.enc.EncodeInt(int64(v)))
	case !opt.MapForm && inTail:
		e.do(e.enc.EncodeNil())
	}
}

// head starts an event of n fields (the tag included): {"type": tag, ...}
// in map form, [tag, ...] otherwise.
func (e *encoder) head(tag string, n int, opt VLLMEncodeOptions) {
	if opt.MapForm {
		e.do(e.enc.EncodeMapLen(n))
		e.do(e.enc.EncodeString("type"))
	} else {
		e.do(e.enc.EncodeArrayLen(n))
	}
	e.do(e.enc.EncodeString(tag))
}

func (e *encoder) hashes(hs []uint64, opt VLLMEncodeOptions) {
	e.do(e.enc.EncodeArrayLen(len(hs)))
	for _, h := range hs {
		e.hash(h, opt)
	}
}

// signedHashes writes hashes as SGLang does: int64, negative when the top
// bit is set.
func (e *encoder) signedHashes(hs []uint64) {
	e.do(e.enc.EncodeArrayLen(len(hs)))
	for _, h := range hs {
		e.do(e.enc.EncodeInt(int64(h)))
	}
}

func (e *encoder) tokens(ids []uint32) {
	e.do(e.enc.EncodeArrayLen(len(ids)))
	for _, t := range ids {
		e.do(e.enc.EncodeUint(uint64(t)))
	}
}

func (e *encoder) key(name string, opt VLLMEncodeOptions) {
	if opt.MapForm {
		e.do(e.enc.EncodeString(name))
	}
}

func (e *encoder) extraKeys(keys [][]any) {
	if keys == nil {
		e.do(e.enc.EncodeNil())
		return
	}
	e.do(e.enc.EncodeArrayLen(len(keys)))
	for _, k := range keys {
		if k == nil {
			e.do(e.enc.EncodeNil())
			continue
		}
		e.do(e.enc.Encode(k))
	}
}

// EncodeSGLangBatch encodes b as SGLang's KVEventBatch: events in array form
// only, hashes as signed int64 (SGLang's hash is the first 8 digest bytes as
// a signed integer, so values with the top bit set go out negative), and a
// trailing {"cache_salt": ...} map on salted BlockStored events.
func EncodeSGLangBatch(b *event.Batch) ([]byte, error) {
	e := newEncoder()
	e.header(b.Timestamp, len(b.Events), b.DPRank, VLLMEncodeOptions{})
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case event.BlockStored:
			n := 7
			if ev.CacheSalt != "" {
				n = 8
			}
			e.head("BlockStored", n, VLLMEncodeOptions{})
			e.signedHashes(ev.BlockHashes)
			if ev.HasParent {
				e.do(e.enc.EncodeInt(int64(ev.ParentHash)))
			} else {
				e.do(e.enc.EncodeNil())
			}
			e.tokens(ev.TokenIDs)
			e.do(e.enc.EncodeInt(int64(ev.BlockSize)))
			if ev.HasLoraID {
				e.do(e.enc.EncodeInt(ev.LoraID))
			} else {
				e.do(e.enc.EncodeNil())
			}
			e.do(e.enc.EncodeString(tierWireName(ev.Medium)))
			if ev.CacheSalt != "" {
				e.do(e.enc.EncodeMapLen(1))
				e.do(e.enc.EncodeString("cache_salt"))
				e.do(e.enc.EncodeString(ev.CacheSalt))
			}
		case event.BlockRemoved:
			e.head("BlockRemoved", 3, VLLMEncodeOptions{})
			e.signedHashes(ev.BlockHashes)
			e.do(e.enc.EncodeString(tierWireName(ev.Medium)))
		case event.AllBlocksCleared:
			e.head("AllBlocksCleared", 1, VLLMEncodeOptions{})
		default:
			return nil, fmt.Errorf("enginepub: cannot encode event kind %d", ev.Kind)
		}
	}
	e.do(e.enc.EncodeInt(int64(b.DPRank)))
	if e.err != nil {
		return nil, e.err
	}
	return e.buf.Bytes(), nil
}
