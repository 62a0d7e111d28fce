package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvindex/kvindex/kvindex"
)

// decodeEvent decodes one event (array or map form) into ev. It returns the
// tag it read (only materialised on error, for the error message) and any
// error; on error the caller rewinds and skips the whole event.
func decodeEvent(r *reader, engine kvindex.Engine, ev *kvindex.Event) (string, error) {
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
			if err := decodeField(r, engine, ev, f); err != nil {
				return string(tag), err
			}
		}
		return "", nil
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
			if err := decodeField(r, engine, ev, mapField(k)); err != nil {
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
		return "", nil
	}
	return "", &typeError{"event array or map", c}
}

func decodeField(r *reader, engine kvindex.Engine, ev *kvindex.Event, f field) error {
	var err error
	switch f {
	case fHashes:
		ev.BlockHashes, err = decodeHashes(r, engine)
		if err != nil {
			err = fmt.Errorf("block_hashes: %w", err)
		}
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
	case fTokens:
		ev.TokenIDs, err = decodeTokens(r)
		if err != nil {
			err = fmt.Errorf("token_ids: %w", err)
		}
	case fBlockSize:
		if r.nextNil() {
			return nil
		}
		var v int64
		if v, err = r.int64v(); err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("%d out of range", v)
		}
		ev.BlockSize = int(v)
		if err != nil {
			err = fmt.Errorf("block_size: %w", err)
		}
	case fLoraID:
		if r.nextNil() {
			return nil
		}
		ev.LoraID, err = r.int64v()
		ev.HasLoraID = err == nil
		if err != nil {
			err = fmt.Errorf("lora_id: %w", err)
		}
	case fMedium:
		if r.nextNil() {
			ev.Medium = kvindex.TierGPU
			return nil
		}
		var s []byte
		if s, err = r.strOrBin(); err != nil {
			return fmt.Errorf("medium: %w", err)
		}
		ev.Medium = parseTier(s)
	case fLoraNameOrSalt:
		return decodeLoraNameOrSalt(r, ev)
	case fCacheSalt:
		if r.nextNil() {
			return nil
		}
		var s []byte
		if s, err = r.strOrBin(); err != nil {
			return fmt.Errorf("cache_salt: %w", err)
		}
		ev.CacheSalt = string(s)
	case fExtraKeys:
		ev.ExtraKeys, err = decodeExtraKeys(r)
		if err != nil {
			err = fmt.Errorf("extra_keys: %w", err)
		}
	case fGroupIdx:
		if r.nextNil() {
			ev.GroupIdx = 0
			return nil
		}
		var v int64
		if v, err = r.int64v(); err == nil && (v < 0 || v > math.MaxUint8) {
			// Holder.Group is a uint8: a larger group index cannot be
			// represented in the index, so reject rather than truncate.
			err = fmt.Errorf("%d out of range", v)
		}
		ev.GroupIdx = int(v)
		if err != nil {
			err = fmt.Errorf("group_idx: %w", err)
		}
	default:
		err = r.skip()
	}
	return err
}

// parseTier avoids the allocation of string(s) for the common media.
func parseTier(s []byte) kvindex.Tier {
	switch string(s) {
	case "GPU", "gpu":
		return kvindex.TierGPU
	case "CPU", "cpu":
		return kvindex.TierCPU
	}
	return kvindex.ParseTier(string(s))
}

// decodeLoraNameOrSalt handles array position 7 of BlockStored: vLLM puts
// lora_name (str) there, SGLang a map {"cache_salt": ...} on salted requests.
func decodeLoraNameOrSalt(r *reader, ev *kvindex.Event) error {
	if r.nextNil() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isMapCode(c) {
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := r.strOrBin()
			if err != nil {
				return fmt.Errorf("extra map key: %w", err)
			}
			if string(k) == "cache_salt" {
				if r.nextNil() {
					continue // no salt; the nil is consumed, not skipped again
				}
				s, err := r.strOrBin()
				if err != nil {
					return fmt.Errorf("cache_salt: %w", err)
				}
				ev.CacheSalt = string(s)
				continue
			}
			if err := r.skip(); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := r.strOrBin()
	if err != nil {
		return fmt.Errorf("lora_name: %w", err)
	}
	ev.LoraName = string(s)
	return nil
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
// is the FIRST 8 bytes. Shorter values are read as one big-endian integer.
func normaliseHashBytes(b []byte, engine kvindex.Engine) (uint64, error) {
	if len(b) == 0 {
		return 0, errors.New("empty hash bytes")
	}
	if len(b) > 8 {
		if engine == kvindex.EngineSGLang {
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

func decodeTokens(r *reader) ([]uint32, error) {
	if r.nextNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint32, n)
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
			}
		}
		v, neg, err := r.intBits()
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		if neg || v > math.MaxUint32 {
			return nil, fmt.Errorf("[%d]: token id %d out of range", i, int64(v))
		}
		out[i] = uint32(v)
	}
	return out, nil
}

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
		if out[i], err = decodeAnyList(r, 0); err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
	}
	return out, nil
}

// decodeAnyList decodes one extra-keys tuple: elements are str -> string,
// int -> int64, bytes -> []byte, nil -> nil, nested list -> []any. Anything
// else cannot be part of a vLLM hash input we reproduce, so it is an error.
func decodeAnyList(r *reader, depth int) ([]any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]any, n)
	for i := range out {
		c, err := r.peek()
		if err != nil {
			return nil, err
		}
		switch {
		case c == 0xc0:
			r.p++
		case isStrCode(c):
			s, err := r.strOrBin()
			if err != nil {
				return nil, err
			}
			out[i] = string(s)
		case isBinCode(c):
			s, err := r.strOrBin()
			if err != nil {
				return nil, err
			}
			out[i] = append([]byte(nil), s...)
		case isIntCode(c):
			if out[i], err = r.int64v(); err != nil {
				return nil, err
			}
		case isArrayCode(c):
			if out[i], err = decodeAnyList(r, depth+1); err != nil {
				return nil, err
			}
		default:
			return nil, &typeError{"extra key (str, int, bytes or list)", c}
		}
	}
	return out, nil
}
