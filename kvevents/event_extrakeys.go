package kvevents

import (
	"fmt"
	"math"

	"github.com/kvindex/kvindex/kvevents/event"
)

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
			out[i] = []any{event.OpaqueExtraKey{What: "extra_keys entry"}}
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
			return event.OpaqueExtraKey{What: "uint64"}, nil
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
	return event.OpaqueExtraKey{What: what}, r.skip()
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
	return event.OpaqueExtraKey{What: "extra key " + tag}, nil
}
