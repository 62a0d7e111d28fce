package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvindex/kvindex/kvindex"
)

// evState is what decoding one event learns besides the event itself.
type evState struct {
	// extrasUnknown: extra_keys or lora_name was present but not readable,
	// so no block of the event can be hashed; it is still indexed.
	extrasUnknown bool
	// ignored counts optional fields skipped because their value could not
	// be interpreted; ignoredName names the first.
	ignored     int
	ignoredName string
	// unknownMedium: medium was a string missing from kvindex.MediumTiers.
	unknownMedium bool
}

func (s *evState) ignore(name string) {
	if s.ignored == 0 {
		s.ignoredName = name
	}
	s.ignored++
}

// decodeEvent decodes one event (array or map form) into ev. It returns the
// tag it read (only materialised on error, for the error message) and any
// error; on error the caller rewinds and skips the whole event.
//
// Only what makes the event meaningless is an error: its structure, its tag,
// block_hashes and parent_block_hash. An optional field whose value cannot
// be interpreted is skipped and counted (evState), and the blocks are kept.
func decodeEvent(r *reader, engine kvindex.Engine, ev *kvindex.Event, es *evState) (string, error) {
	c, err := r.peek()
	if err != nil {
		return "", err
	}
	switch {
	case isArrayCode(c):
		n, err := r.arrayLen()
		if err != nil {
			return "", err
		}
		if n == 0 {
			return "", errors.New("empty event array")
		}
		tag, err := r.strOrBin()
		if err != nil {
			return "", fmt.Errorf("event tag: %w", err)
		}
		ev.Kind = kindOf(tag)
		var fields []field
		switch ev.Kind {
		case kvindex.BlockStored:
			fields = storedFields[:]
		case kvindex.BlockRemoved:
			fields = removedFields[:]
		case kvindex.AllBlocksCleared:
		default:
			return string(tag), errUnknownEvent
		}
		for i := 1; i < n; i++ {
			f := fNone
			if i < len(fields) {
				f = fields[i]
			}
			if err := decodeField(r, engine, ev, f, es); err != nil {
				return string(tag), err
			}
		}
	case isMapCode(c):
		n, err := r.mapLen()
		if err != nil {
			return "", err
		}
		var tag []byte
		for i := 0; i < n; i++ {
			k, err := r.strOrBin()
			if err != nil {
				return string(tag), fmt.Errorf("event key: %w", err)
			}
			if string(k) == "type" {
				if tag, err = r.strOrBin(); err != nil {
					return "", fmt.Errorf("event type: %w", err)
				}
				continue
			}
			// decodeField names the field in its errors; an unknown key's
			// value is only skipped, and failing that fails the batch.
			if err := decodeField(r, engine, ev, mapField(k), es); err != nil {
				return string(tag), err
			}
		}
		if tag == nil {
			return "", errors.New("event map has no type")
		}
		ev.Kind = kindOf(tag)
		if ev.Kind == 0 {
			return string(tag), errUnknownEvent
		}
	default:
		return "", &typeError{"event array or map", c}
	}
	if es.extrasUnknown && ev.Kind == kvindex.BlockStored {
		ev.ExtraKeys = make([][]any, len(ev.BlockHashes))
		for i := range ev.ExtraKeys {
			ev.ExtraKeys[i] = []any{kvindex.OpaqueExtraKey{What: "extra_keys"}}
		}
	}
	return "", nil
}

// errSessionIDTooLong: a session id beyond kvindex.MaxSessionIDLen is
// skipped (and counted), so a publisher cannot make the applier hold
// arbitrarily long strings.
var errSessionIDTooLong = errors.New("session_id too long")

// optional decodes an optional field with fn; a value fn cannot interpret
// is skipped and counted instead of failing the event.
func optional(r *reader, es *evState, name string, fn func() error) error {
	start := r.p
	if err := fn(); err != nil {
		r.p = start
		if serr := r.skip(); serr != nil {
			return fmt.Errorf("%s: %w", name, serr)
		}
		es.ignore(name)
	}
	return nil
}

func decodeField(r *reader, engine kvindex.Engine, ev *kvindex.Event, f field, es *evState) error {
	var err error
	switch f {
	case fHashes:
		ev.BlockHashes, err = decodeHashes(r, engine)
		if err != nil {
			err = fmt.Errorf("block_hashes: %w", err)
		}
		return err
	case fParent:
		if r.nextNil() {
			ev.HasParent = false
			return nil
		}
		ev.ParentHash, err = decodeHash(r, engine)
		ev.HasParent = err == nil
		if err != nil {
			err = fmt.Errorf("parent_block_hash: %w", err)
		}
		return err
	case fTokens:
		return optional(r, es, "token_ids", func() error {
			ev.TokenIDs, ev.Bigram, err = decodeTokens(r)
			return err
		})
	case fBlockSize:
		return optional(r, es, "block_size", func() error {
			v, err := optInt(r, math.MaxInt32)
			ev.BlockSize = int(v)
			return err
		})
	case fLoraID:
		return optional(r, es, "lora_id", func() error {
			if r.nextNil() {
				return nil
			}
			ev.LoraID, err = r.int64v()
			ev.HasLoraID = err == nil
			return err
		})
	case fMedium:
		before := es.ignored
		err := optional(r, es, "medium", func() error {
			if r.nextNil() {
				ev.Medium = kvindex.TierGPU
				return nil
			}
			s, err := r.strOrBin()
			if err != nil {
				return err
			}
			var known bool
			ev.Medium, known = parseTier(s)
			es.unknownMedium = es.unknownMedium || !known
			return nil
		})
		if es.ignored > before {
			// Unreadable: not the pod's GPU cache for sure, so not GPU.
			ev.Medium = kvindex.TierExternal
		}
		return err
	case fLoraNameOrSalt:
		return decodeLoraNameOrSalt(r, ev, es)
	case fCacheSalt:
		return optional(r, es, "cache_salt", func() error {
			if r.nextNil() {
				return nil
			}
			s, err := r.strOrBin()
			ev.CacheSalt = string(s)
			return err
		})
	case fExtraKeys:
		return optional(r, es, "extra_keys", func() error {
			ev.ExtraKeys, err = decodeExtraKeys(r)
			if err != nil {
				es.extrasUnknown = true
			}
			return err
		})
	case fGroupIdx:
		return optional(r, es, "group_idx", func() error {
			v, err := optInt(r, math.MaxInt32)
			ev.GroupIdx = int(v)
			return err
		})
	case fSpecKind:
		return optional(r, es, "kv_cache_spec_kind", func() error {
			if r.nextNil() {
				return nil
			}
			s, err := r.strOrBin()
			ev.GroupKind = kvindex.ParseGroupKind(string(s))
			return err
		})
	case fSlidingWindow:
		return optional(r, es, "kv_cache_spec_sliding_window", func() error {
			v, err := optInt(r, math.MaxInt32)
			ev.SlidingWindow = int(v)
			return err
		})
	case fLocality:
		return optional(r, es, "locality", func() error {
			if r.nextNil() {
				return nil
			}
			s, err := r.strOrBin()
			ev.Remote = err == nil && isRemote(s)
			return err
		})
	case fOwnership:
		return optional(r, es, "ownership", func() error {
			if r.nextNil() {
				return nil
			}
			s, err := r.strOrBin()
			ev.Ownership = string(s)
			return err
		})
	case fSessionID:
		return optional(r, es, "session_id", func() error {
			if r.nextNil() {
				return nil
			}
			s, err := r.strOrBin()
			if err != nil {
				return err
			}
			if len(s) > kvindex.MaxSessionIDLen {
				return errSessionIDTooLong
			}
			ev.SessionID = string(s)
			return nil
		})
	case fMMKeys:
		// A block whose key hashed a media digest cannot be rehashed from
		// its token ids: the event's blocks are kept unverified under
		// their hashes, whatever the digests are.
		return optional(r, es, "mm_keys", func() error {
			if r.nextNil() {
				return nil
			}
			n, err := r.arrayLen()
			if err != nil {
				return err
			}
			for i := 0; i < n; i++ {
				m, err := r.arrayLen()
				if err != nil {
					return err
				}
				es.extrasUnknown = es.extrasUnknown || m > 0
				for j := 0; j < m; j++ {
					if err := r.skip(); err != nil {
						return err
					}
				}
			}
			return nil
		})
	case fCopies:
		return optional(r, es, "remaining_copy_counts", func() error {
			return decodeCopies(r, ev)
		})
	case fCopiesOrLocality:
		// BlockRemoved's 5th array element: vLLM's remaining_copy_counts
		// (a list) or, from publishers following the older draft, locality.
		if c, err := r.peek(); err == nil && isStrCode(c) {
			return decodeField(r, engine, ev, fLocality, es)
		}
		return decodeField(r, engine, ev, fCopies, es)
	}
	return r.skip()
}

// optInt reads nil (0) or an integer in [0, hi].
func optInt(r *reader, hi int64) (int64, error) {
	if r.nextNil() {
		return 0, nil
	}
	v, err := r.int64v()
	if err == nil && (v < 0 || v > hi) {
		return 0, fmt.Errorf("%d out of range", v)
	}
	return v, err
}

func isRemote(s []byte) bool {
	return len(s) == 6 && strings.EqualFold(string(s), "REMOTE")
}

// decodeCopies reads remaining_copy_counts: nil or a list of counts.
func decodeCopies(r *reader, ev *kvindex.Event) error {
	if r.nextNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	out := make([]uint32, n)
	for i := range out {
		v, err := r.int64v()
		if err != nil {
			return err
		}
		if v < 0 || v > math.MaxUint32 {
			return fmt.Errorf("copy count %d out of range", v)
		}
		out[i] = uint32(v)
	}
	ev.RemainingCopies, ev.HasRemainingCopies = out, true
	return nil
}

// parseTier avoids the allocation of string(s) for the common media.
func parseTier(s []byte) (kvindex.Tier, bool) {
	switch string(s) {
	case "GPU", "gpu":
		return kvindex.TierGPU, true
	case "CPU", "cpu", "CPU_PINNED":
		return kvindex.TierCPU, true
	}
	return kvindex.LookupTier(string(s))
}

// decodeLoraNameOrSalt handles array position 7 of BlockStored: vLLM puts
// lora_name (str) there, SGLang a map {"cache_salt": ...} on salted requests
// (its BlockStoredWithMetadata) or, in a proposed extension, extra_keys (a
// list: its only field after medium). A value that is none of these leaves
// the blocks unhashable: lora_name is part of vLLM's hash input.
func decodeLoraNameOrSalt(r *reader, ev *kvindex.Event, es *evState) error {
	if r.nextNil() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isArrayCode(c) {
		return decodeField(r, kvindex.EngineSGLang, ev, fExtraKeys, es)
	}
	if isMapCode(c) {
		before := es.ignored
		defer func() {
			// An unreadable metadata map may hide a cache_salt, which is
			// part of the first block's hash.
			es.extrasUnknown = es.extrasUnknown || es.ignored > before
		}()
		return optional(r, es, "metadata", func() error {
			n, err := r.mapLen()
			if err != nil {
				return err
			}
			for i := 0; i < n; i++ {
				k, err := r.strOrBin()
				if err != nil {
					return err
				}
				if string(k) == "cache_salt" {
					if r.nextNil() {
						continue // no salt; the nil is consumed, not skipped again
					}
					s, err := r.strOrBin()
					if err != nil {
						return err
					}
					ev.CacheSalt = string(s)
					continue
				}
				if err := r.skip(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return optional(r, es, "lora_name", func() error {
		s, err := r.strOrBin()
		if err != nil {
			es.extrasUnknown = true
		}
		ev.LoraName = string(s)
		return err
	})
}

func decodeHashes(r *reader, engine kvindex.Engine) ([]uint64, error) {
	if r.nextNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	b := r.b
	for i := range out {
		// Fast path: vLLM's default hashes are mostly 9-byte uint64s.
		if p := r.p; p+9 <= len(b) && b[p] == 0xcf {
			out[i] = binary.BigEndian.Uint64(b[p+1:])
			r.p += 9
			continue
		}
		if out[i], err = decodeHash(r, engine); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

// decodeHash normalises one block hash to uint64:
//   - any msgpack integer, any width or sign: its two's complement 64 bits.
//     That is vLLM's default (the last 8 digest bytes as an unsigned int),
//     SGLang's signed int64 (first 8 digest bytes) and old Python hash()
//     values alike.
//   - bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: 16, 32 or 64
//     byte digests): see normaliseHashBytes.
func decodeHash(r *reader, engine kvindex.Engine) (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if isIntCode(c) {
		v, _, err := r.intBits()
		return v, err
	}
	if isBinCode(c) || isStrCode(c) {
		b, err := r.strOrBin()
		if err != nil {
			return 0, err
		}
		return normaliseHashBytes(b, engine)
	}
	return 0, &typeError{"hash (int or bytes)", c}
}

// normaliseHashBytes reduces a digest to the 64 bits that engine would have
// sent as an integer: vLLM's int form is the LAST 8 bytes big-endian, SGLang's
// the FIRST 8 bytes (kvindex.EngineInfo.HeadKey). Shorter values are read as
// one big-endian integer.
func normaliseHashBytes(b []byte, engine kvindex.Engine) (uint64, error) {
	if len(b) == 0 {
		return 0, errors.New("empty hash bytes")
	}
	if len(b) > 8 {
		if engine.Info().HeadKey {
			b = b[:8]
		} else {
			b = b[len(b)-8:]
		}
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v, nil
}

// decodeTokens reads token_ids. SGLang with EAGLE speculative decoding keys
// its radix tree by bigrams and publishes each position as a pair [t_i,
// t_i+1]: the first token is the token at that position, the second its
// successor. The first is kept (bigram reports that pairs were seen).
func decodeTokens(r *reader) (out []uint32, bigram bool, err error) {
	if r.nextNil() {
		return nil, false, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, false, err
	}
	out = make([]uint32, n)
	b := r.b
	for i := range out {
		// Fast paths for the encodings token ids actually use.
		if p := r.p; p < len(b) {
			switch c := b[p]; {
			case c <= 0x7f:
				out[i] = uint32(c)
				r.p++
				continue
			case c == 0xcd && p+3 <= len(b):
				out[i] = uint32(binary.BigEndian.Uint16(b[p+1:]))
				r.p += 3
				continue
			case c == 0xce && p+5 <= len(b):
				out[i] = binary.BigEndian.Uint32(b[p+1:])
				r.p += 5
				continue
			case isArrayCode(c):
				if out[i], err = tokenPair(r); err != nil {
					return nil, false, fmt.Errorf("[%d]: %w", i, err)
				}
				bigram = true
				continue
			}
		}
		if out[i], err = tokenID(r); err != nil {
			return nil, false, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, bigram, nil
}

func tokenID(r *reader) (uint32, error) {
	v, neg, err := r.intBits()
	if err != nil {
		return 0, err
	}
	if neg || v > math.MaxUint32 {
		return 0, fmt.Errorf("token id %d out of range", int64(v))
	}
	return uint32(v), nil
}

// tokenPair reads an EAGLE bigram [t_i, t_i+1] and returns t_i.
func tokenPair(r *reader) (uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return 0, err
	}
	if n != 2 {
		return 0, fmt.Errorf("token pair has %d elements", n)
	}
	t, err := tokenID(r)
	if err != nil {
		return 0, err
	}
	_, err = tokenID(r)
	return t, err
}

// decodeExtraKeys reads extra_keys: nil or one entry per block, each nil or
// a list. A list's values are decoded by decodeExtraValue: what cannot be
// reproduced becomes an OpaqueExtraKey, so the block stays indexed (under
// the engine's hash) instead of being dropped. An error means the field's
// shape itself is unreadable.
func decodeExtraKeys(r *reader) ([][]any, error) {
	if r.nextNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([][]any, n)
	for i := range out {
		if r.nextNil() {
			continue
		}
		c, err := r.peek()
		if err != nil {
			return nil, err
		}
		if !isArrayCode(c) {
			// One block's entry is not a tuple: that block is unhashable.
			if err := r.skip(); err != nil {
				return nil, err
			}
			out[i] = []any{kvindex.OpaqueExtraKey{What: "extra_keys entry"}}
			continue
		}
		v, err := decodeExtraValue(r, 0)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		out[i] = v.([]any)
	}
	return out, nil
}

// decodeExtraValue decodes one value of an extra-keys tuple as vLLM hashed
// it: str -> string, int -> int64, bool, nil, bytes -> []byte, list -> []any
// (a tuple). Typed keys, tagged maps {"type": ...}, become the value vLLM's
// block hasher saw:
//
//	{"type": "lora", "name": n}                  -> n
//	{"type": "cache_salt", "salt": s}            -> s
//	{"type": "prompt_embeds", "hash": h}         -> h (bytes)
//	{"type": "mm", "hash": id, "block_offset": o} -> (id, o)
//	{"type": "legacy", "value": v}               -> v
//
// Floats, other maps and extension types become an OpaqueExtraKey. Only
// truncation and nesting beyond maxDepth are errors.
func decodeExtraValue(r *reader, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == 0xc0:
		r.p++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		r.p++
		return c == 0xc3, nil
	case isStrCode(c):
		s, err := r.strOrBin()
		return string(s), err
	case isBinCode(c):
		s, err := r.strOrBin()
		return append([]byte(nil), s...), err
	case isIntCode(c):
		v, neg, err := r.intBits()
		if err == nil && c == 0xcf && !neg && v > math.MaxInt64 {
			// Python ints are unbounded; one above int64 is hashable by
			// vLLM but not reproduced here.
			return kvindex.OpaqueExtraKey{What: "uint64"}, nil
		}
		return int64(v), err
	case isArrayCode(c):
		n, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = decodeExtraValue(r, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case isMapCode(c):
		return decodeTaggedKey(r, depth)
	}
	what := "float"
	if c != 0xca && c != 0xcb {
		what = fmt.Sprintf("msgpack type 0x%02x", c)
	}
	return kvindex.OpaqueExtraKey{What: what}, r.skip()
}

// decodeTaggedKey reads a typed extra key {"type": tag, field: value, ...}
// in any key order (see decodeExtraValue).
func decodeTaggedKey(r *reader, depth int) (any, error) {
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	var tag string
	var name, hash, offset, value any
	var hasOffset, hasValue, badKey bool
	for i := 0; i < n; i++ {
		kc, err := r.peek()
		if err != nil {
			return nil, err
		}
		if !isStrCode(kc) {
			badKey = true
			if err := r.skip(); err != nil {
				return nil, err
			}
			if err := r.skip(); err != nil {
				return nil, err
			}
			continue
		}
		k, _ := r.strOrBin()
		v, err := decodeExtraValue(r, depth+1)
		if err != nil {
			return nil, err
		}
		switch string(k) {
		case "type":
			tag, _ = v.(string)
		case "name", "salt":
			name = v
		case "hash":
			hash = v
		case "block_offset", "offset":
			offset, hasOffset = v, true
		case "value":
			value, hasValue = v, true
		}
	}
	str := func(v any) bool { _, ok := v.(string); return ok }
	switch {
	case badKey:
	case tag == "lora" && str(name), tag == "cache_salt" && str(name):
		return name, nil
	case tag == "prompt_embeds":
		if b, ok := hash.([]byte); ok {
			return b, nil
		}
	case tag == "mm" && str(hash) && hasOffset:
		if _, ok := offset.(int64); ok {
			return []any{hash, offset}, nil
		}
	case tag == "legacy" && hasValue:
		return value, nil
	}
	if tag == "" {
		tag = "map"
	}
	return kvindex.OpaqueExtraKey{What: "extra key " + tag}, nil
}
