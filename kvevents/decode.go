package kvevents

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// DecodeStats reports what Decode found besides the batch itself.
type DecodeStats struct {
	// EventErrors is how many events were malformed and dropped; the rest of
	// the batch is still in the result.
	EventErrors int
	// FirstEventError describes the first dropped event (nil if none).
	FirstEventError error
	// HasDPRank is false when the batch carried no data-parallel rank (older
	// engines, or nil): DPRank is then 0.
	HasDPRank bool
	// IgnoredFields counts optional fields whose value could not be
	// interpreted and was skipped (their events are kept); FirstIgnored
	// names the first.
	IgnoredFields int
	FirstIgnored  string
	// UnknownMedia counts events whose medium is not in event.MediumTiers
	// (indexed as external storage).
	UnknownMedia int
	// PackedEvents counts events that arrived as msgpack bytes holding an
	// encoded event (llm-d's storage-tier publisher) and were decoded.
	PackedEvents int
}

// BatchError means the whole message could not be decoded (not a batch, or
// truncated): the message is dropped.
type BatchError struct{ Err error }

func (e *BatchError) Error() string { return "kvevents: malformed batch: " + e.Err.Error() }
func (e *BatchError) Unwrap() error { return e.Err }

// EventError describes one dropped event.
type EventError struct {
	Index int    // position of the event in its batch
	Type  string // event tag, if it was read
	Err   error
}

func (e *EventError) Error() string {
	return fmt.Sprintf("kvevents: event %d (%s) dropped: %v", e.Index, e.Type, e.Err)
}
func (e *EventError) Unwrap() error { return e.Err }

var errUnknownEvent = errors.New("unknown event type")

// Decode parses one msgpack payload (a vLLM, SGLang or TensorRT-LLM
// KVEventBatch) into b: Timestamp, DPRank and Events are set; Pod, Model,
// Engine and Seq are left for the caller (they come from the topic and
// frames). The engines put the same batch on the wire; engine only changes
// how byte-string hashes are reduced to 64 bits (see normaliseHashBytes).
//
// Accepted batch shapes: [ts, events], [ts, events, dp_rank|nil, ...] and a
// map {"ts", "events", "data_parallel_rank"|"attn_dp_rank"|"dp_rank"}.
// Events may be in array form ["BlockStored", f1, f2, ...] or map form
// {"type": "BlockStored", "block_hashes": ..., ...}, mixed freely. A malformed
// event is skipped and counted in the returned stats; a malformed batch
// returns a *BatchError and b must not be used.
//
// Decode never retains payload: every string and slice in b is a copy.
func Decode(payload []byte, engine blockkeys.Engine, b *event.Batch) (DecodeStats, error) {
	var st DecodeStats
	r := reader{b: payload}
	b.Events = b.Events[:0]
	b.DPRank = 0
	b.Timestamp = 0
	c, err := r.peek()
	if err != nil {
		return st, &BatchError{err}
	}
	switch {
	case isArrayCode(c):
		n, err := r.arrayLen()
		if err != nil {
			return st, &BatchError{err}
		}
		if n < 2 {
			return st, &BatchError{fmt.Errorf("batch array has %d elements, want >= 2", n)}
		}
		if b.Timestamp, err = decodeTS(&r); err != nil {
			return st, &BatchError{fmt.Errorf("ts: %w", err)}
		}
		if err := decodeEvents(&r, engine, b, &st); err != nil {
			return st, &BatchError{err}
		}
		if n >= 3 {
			if err := decodeDPRank(&r, b, &st); err != nil {
				return st, &BatchError{err}
			}
		}
		for i := 3; i < n; i++ {
			if err := r.skip(); err != nil {
				return st, &BatchError{err}
			}
		}
	case isMapCode(c):
		n, err := r.mapLen()
		if err != nil {
			return st, &BatchError{err}
		}
		sawEvents := false
		for i := 0; i < n; i++ {
			k, err := r.strOrBin()
			if err != nil {
				return st, &BatchError{fmt.Errorf("batch key: %w", err)}
			}
			switch string(k) {
			case "ts":
				b.Timestamp, err = decodeTS(&r)
			case "events":
				err = decodeEvents(&r, engine, b, &st)
				sawEvents = true
			case "data_parallel_rank", "attn_dp_rank", "dp_rank":
				err = decodeDPRank(&r, b, &st)
			default:
				err = r.skip()
			}
			if err != nil {
				return st, &BatchError{fmt.Errorf("%s: %w", k, err)}
			}
		}
		if !sawEvents {
			return st, &BatchError{errors.New("batch map has no events")}
		}
	default:
		return st, &BatchError{&typeError{"batch array or map", c}}
	}
	if r.remaining() != 0 {
		return st, &BatchError{fmt.Errorf("%d trailing bytes after batch", r.remaining())}
	}
	return st, nil
}

func decodeTS(r *reader) (float64, error) {
	if r.nextNil() {
		return 0, nil
	}
	return r.float()
}

func decodeDPRank(r *reader, b *event.Batch, st *DecodeStats) error {
	if r.nextNil() {
		return nil
	}
	v, err := r.int64v()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if v < 0 || v > math.MaxInt32 {
		return fmt.Errorf("data_parallel_rank %d out of range", v)
	}
	b.DPRank = int(v)
	st.HasDPRank = true
	return nil
}

func decodeEvents(r *reader, engine blockkeys.Engine, b *event.Batch, st *DecodeStats) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	// The header's count is bounded only by the bytes left, and an Event is
	// ~150 bytes: reserve only what the payload can really hold, so a hostile
	// count cannot make one message allocate 150x its size.
	if want := min(n, r.remaining()/minEventBytes+1); cap(b.Events)-len(b.Events) < want {
		ev := make([]event.Event, len(b.Events), len(b.Events)+want)
		copy(ev, b.Events)
		b.Events = ev
	}
	for i := 0; i < n; i++ {
		start := r.p
		b.Events = append(b.Events, event.Event{})
		ev := &b.Events[len(b.Events)-1]
		var es evState
		tag, err := decodeEventOrPacked(r, engine, ev, &es, st)
		if err == nil {
			if es.ignored > 0 {
				if st.IgnoredFields == 0 {
					st.FirstIgnored = es.ignoredName
				}
				st.IgnoredFields += es.ignored
			}
			if es.unknownMedium {
				st.UnknownMedia++
			}
			continue
		}
		// Drop this event only: rewind and skip the whole value. If even
		// that fails the message itself is broken.
		b.Events = b.Events[:len(b.Events)-1]
		r.p = start
		if serr := r.skip(); serr != nil {
			return fmt.Errorf("event %d: %w", i, serr)
		}
		st.EventErrors++
		if st.FirstEventError == nil {
			st.FirstEventError = &EventError{Index: i, Type: tag, Err: err}
		}
	}
	return nil
}

// decodeEventOrPacked decodes one element of the events list. llm-d's
// storage-tier publisher puts each event in the list as msgpack bytes
// holding an already encoded event: such a bin is decoded as the event it
// holds (one level: bytes inside those bytes are an error).
func decodeEventOrPacked(r *reader, engine blockkeys.Engine, ev *event.Event, es *evState, st *DecodeStats) (string, error) {
	c, err := r.peek()
	if err != nil || !isBinCode(c) {
		return decodeEvent(r, engine, ev, es)
	}
	raw, err := r.strOrBin()
	if err != nil {
		return "", err
	}
	inner := reader{b: raw}
	if c, err := inner.peek(); err == nil && isBinCode(c) {
		return "", errors.New("packed event holds bytes again")
	}
	tag, err := decodeEvent(&inner, engine, ev, es)
	if err == nil && inner.remaining() != 0 {
		err = fmt.Errorf("%d trailing bytes after packed event", inner.remaining())
	}
	if err == nil {
		st.PackedEvents++
	}
	return tag, err
}

// minEventBytes is the smallest encoding of an event Decode keeps:
// ["BlockRemoved"] (array header, str header, 12 bytes).
const minEventBytes = 14

// field identifies an event field independent of its wire position.
type field uint8

const (
	fNone field = iota
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoraID
	fMedium
	fLoraNameOrSalt // vLLM: lora_name (str); SGLang: {"cache_salt": ...} map
	fExtraKeys
	fGroupIdx
	fCacheSalt
	fSpecKind
	fSlidingWindow
	fLocality
	fOwnership
	// fMMKeys: TensorRT-LLM's mm_keys, one list of multimodal item keys per
	// block; a block with items hashed their content digests.
	fMMKeys
	fCopies
	fCopiesOrLocality // BlockRemoved array position 4
	// fSessionID: vLLM's optional BlockStored.session_id (PR #51381), a
	// map key only: vLLM's events with it are maps, and its position in an
	// array form is not published.
	fSessionID
)

// Array-form field positions (index 0 is the tag), in the declaration order
// of vLLM's structs (msgspec array_like encodes fields in that order and,
// with omit_defaults, drops trailing defaults). SGLang's BlockStored shares
// positions 1..6 with vLLM; its 8th element (index 7) is a map where vLLM
// has lora_name, so index 7 is decoded by its type.
var storedFields = [...]field{fNone, fHashes, fParent, fTokens, fBlockSize, fLoraID, fMedium, fLoraNameOrSalt,
	fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow, fLocality, fOwnership}
var removedFields = [...]field{fNone, fHashes, fMedium, fGroupIdx, fCopiesOrLocality, fOwnership}

func mapField(name []byte) field {
	switch string(name) {
	case "block_hashes":
		return fHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokens
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoraID
	case "medium":
		return fMedium
	case "lora_name", "metadata":
		return fLoraNameOrSalt
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "cache_salt":
		return fCacheSalt
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "locality":
		return fLocality
	case "ownership":
		return fOwnership
	case "mm_keys":
		return fMMKeys
	case "remaining_copy_counts":
		return fCopies
	case "session_id":
		return fSessionID
	}
	return fNone
}

// kindOf maps an event tag to its kind; 0 means unknown.
func kindOf(tag []byte) event.Kind {
	switch string(tag) {
	case "BlockStored":
		return event.BlockStored
	case "BlockRemoved":
		return event.BlockRemoved
	case "AllBlocksCleared":
		return event.AllBlocksCleared
	}
	return 0
}
