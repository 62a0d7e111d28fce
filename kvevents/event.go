package kvevents

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
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
	// unknownMedium: medium was a string missing from event.MediumTiers.
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
func decodeEvent(r *reader, engine blockkeys.Engine, ev *event.Event, es *evState) (string, error) {
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
		case event.BlockStored:
			fields = storedFields[:]
		case event.BlockRemoved:
			fields = removedFields[:]
		case event.AllBlocksCleared:
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
	if es.extrasUnknown && ev.Kind == event.BlockStored {
		ev.ExtraKeys = make([][]any, len(ev.BlockHashes))
		for i := range ev.ExtraKeys {
			ev.ExtraKeys[i] = []any{event.OpaqueExtraKey{What: "extra_keys"}}
		}
	}
	return "", nil
}

// errSessionIDTooLong: a session id beyond event.MaxSessionIDLen is
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

func decodeField(r *reader, engine blockkeys.Engine, ev *event.Event, f field, es *evState) error {
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
		// 0 is "no parent": llm-d's publishers (llm-d-kv-cache kvevents,
		// llm-d-inference-sim) send kvblock.EmptyBlockHash = 0 for a
		// chain's first block where vLLM sends nil. No engine's real hash
		// is 0 but by chance: each is 64 bits of a SHA-256 or xxh3_128
		// digest (vLLM, SGLang, TensorRT-LLM), 2^-64 per block, the odds
		// of any two blocks colliding, which every key already accepts.
		ev.HasParent = err == nil && ev.ParentHash != 0
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
				ev.Medium = event.TierGPU
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
			ev.Medium = event.TierExternal
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
			ev.GroupKind = event.ParseGroupKind(string(s))
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
			if len(s) > event.MaxSessionIDLen {
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
func decodeCopies(r *reader, ev *event.Event) error {
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
func parseTier(s []byte) (event.Tier, bool) {
	switch string(s) {
	case "GPU", "gpu":
		return event.TierGPU, true
	case "CPU", "cpu", "CPU_PINNED":
		return event.TierCPU, true
	}
	return event.LookupTier(string(s))
}

// decodeLoraNameOrSalt handles array position 7 of BlockStored: vLLM puts
// lora_name (str) there, SGLang a map {"cache_salt": ...} on salted requests
// (its BlockStoredWithMetadata) or, in a proposed extension, extra_keys (a
// list: its only field after medium). A value that is none of these leaves
// the blocks unhashable: lora_name is part of vLLM's hash input.
func decodeLoraNameOrSalt(r *reader, ev *event.Event, es *evState) error {
	if r.nextNil() {
		return nil
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	if isArrayCode(c) {
		return decodeField(r, blockkeys.EngineSGLang, ev, fExtraKeys, es)
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
