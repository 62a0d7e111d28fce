package kvindex

import (
	"context"
	"fmt"
)

// eventExtras sets ek to block i's extra keys. ok=false means they cannot be
// known: a LoRA request whose engine sent its id but neither lora_name nor
// extra_keys (vLLM v0.12 to early 2026 hashed the name).
func eventExtras(ek *extraKeys, ev *Event, engine Engine, i int) bool {
	if len(ev.ExtraKeys) > 0 {
		ek.n = 0
		ek.generic = nil
		if i < len(ev.ExtraKeys) {
			ek.generic = ev.ExtraKeys[i] // empty = None: vLLM never hashes an empty tuple
		}
		return true
	}
	if ev.LoraName == "" && ev.HasLoraID && ev.LoraID != 0 {
		return false
	}
	x := RequestExtras{LoraName: ev.LoraName}
	if engine == EngineSGLang {
		x.CacheSalt = ev.CacheSalt
	}
	// cache_salt only enters a request's first block: the one without parent.
	ek.forRequest(x, i == 0 && !ev.HasParent)
	return true
}

func (a *Applier) stored(ctx context.Context, ps *podState, engine Engine, ev *Event, d *batchDelta) error {
	n := len(ev.BlockHashes)
	if n == 0 {
		return nil
	}
	bounds, bit := ps.storeGroup(ev)
	switch {
	case ev.Remote:
		d.remote += uint64(n)
		return nil
	case !bounds:
		d.groupSkipped += uint64(n)
		return nil
	}
	h := ps.hasher
	bs, dlen := h.cfg.BlockSize, h.dlen
	sglang := engine == EngineSGLang
	keys := ps.keys[:0]

	haveTokens := len(ev.TokenIDs) > 0
	bsWrong := haveTokens && ev.BlockSize > 0 && ev.BlockSize != bs
	// A lone block shorter than the block size with exactly that many tokens
	// is a trailing partial page (SGLang), not a different configuration:
	// no hint from it.
	partial := bsWrong && n == 1 && ev.BlockSize < bs && len(ev.TokenIDs) == ev.BlockSize
	bsWrong = bsWrong && !partial
	base := unverifiedNone
	switch {
	case !haveTokens:
		base = unverifiedNoTokens
	case partial:
		base = unverifiedPartialBlock
	case bsWrong:
		base = unverifiedBlockSize
	case len(ev.TokenIDs) != n*bs:
		base = unverifiedTokenCount
	}
	if bsWrong {
		if !sglang {
			d.mismatches += uint64(n) // counted here, not again as unverified below
		}
		if !ps.hintFinal {
			ps.hintFinal = true
			d.hint = fmt.Sprintf("block size: engine publishes block_size=%d but kvindex is configured with %d; "+
				"set the engine's --block-size (SGLang: --page-size, default 1) or kvindex's block size (per model) to agree",
				ev.BlockSize, bs)
		}
	}

	var parent [32]byte
	parentOK := true
	if !ev.HasParent {
		parent = h.none
	} else {
		parentOK = ps.dc.get(ev.ParentHash, &parent)
	}
	if !sglang && !ps.parity.check(base == unverifiedNone && parentOK) {
		// Sampled out: the engine's hashes (or their aliases) go in
		// unchecked, through the same copy, group and share accounting.
		keys = a.storedUnchecked(ps, ev, keys, d)
		keys = a.holdStored(ps, engine, ev, bit, keys, d)
		ps.keys = a.trimToShare(ps, keys)
		return a.addStored(ctx, ps, ev, d)
	}
	var ek extraKeys
	for i, eh := range ev.BlockHashes {
		reason := base
		if reason == unverifiedNone && !parentOK {
			reason = unverifiedParent
		}
		if reason == unverifiedNone && !eventExtras(&ek, ev, engine, i) {
			reason = unverifiedLoraName
		}
		if reason == unverifiedNone {
			var dg [32]byte
			var err error
			ps.buf, dg, err = h.digest(ps.buf, parent[:dlen], ev.TokenIDs[i*bs:(i+1)*bs], &ek)
			if err == nil {
				k := keyOf(&dg, dlen)
				ps.dc.put(eh, &dg)
				parent = dg
				keys = append(keys, k)
				switch {
				case sglang:
					if !a.aliasPut(ps, eh, k) {
						keys = keys[:len(keys)-1]
						d.unkeyed++
					}
				case uint64(k) == eh:
					d.matches++
					ps.everMatched = true
					ps.parity.matched()
				case ps.everMatched:
					// Other blocks of this pod match, so its seed, algorithm and
					// block size are right: the engine hashed extra keys it did not
					// publish (multimodal items, cache_salt without extra_keys).
					// Its hash is then the truth for this block; ours is not.
					d.mismatches++
					ps.parity.reset()
					keys[len(keys)-1] = Key(eh)
					if !ps.hintFinal {
						ps.hintFinal = true
						d.hint = "extra keys: some blocks match and others differ; the engine hashes extra keys " +
							"(multimodal, cache_salt, LoRA) it does not publish in extra_keys; those blocks are " +
							"indexed under the engine's hashes"
					}
				default:
					d.mismatches++
					ps.parity.reset()
					if !a.aliasPut(ps, eh, k) {
						keys[len(keys)-1] = Key(eh) // removals must still find it
					}
					if !ps.hintFinal {
						a.diagnose(ps, ev, engine, i, eh, d)
					}
				}
				continue
			}
			// an extra key we cannot serialise (OpaqueExtraKey, ...)
			reason = unverifiedExtraKeys
		}
		// Not computable here; the chain may resume if we know this block.
		parentOK = ps.dc.get(eh, &parent)
		k, aliased := Key(eh), false
		if ps.alias != nil {
			k, aliased = ps.alias.get(eh)
		}
		if !bsWrong || sglang {
			d.unverify(reason, 1)
		}
		switch {
		case aliased:
			keys = append(keys, k)
		case sglang:
			d.unkeyed++ // an SGLang hash is useless to routers
		default:
			keys = append(keys, Key(eh))
		}
	}
	keys = a.holdStored(ps, engine, ev, bit, keys, d)
	keys = a.trimToShare(ps, keys)
	ps.keys = keys
	return a.addStored(ctx, ps, ev, d)
}

// addStored adds the event's keys, prepared in ps.keys, to the index.
func (a *Applier) addStored(ctx context.Context, ps *podState, ev *Event, d *batchDelta) error {
	keys := ps.keys
	if len(keys) == 0 {
		return nil
	}
	if err := a.idx.Add(ctx, ps.modelID, ps.id, ev.Medium, 0, keys); err != nil {
		return err
	}
	d.stored += uint64(len(keys))
	return nil
}

// diagnose names the likely cause of a parity mismatch. On a request's first
// block (parent = NONE_HASH) it can tell algorithm from seed: it rehashes the
// block with the other algorithms and the same seed.
func (a *Applier) diagnose(ps *podState, ev *Event, engine Engine, i int, eh uint64, d *batchDelta) {
	h := ps.hasher
	cfg := h.cfg
	if ev.HasParent || i != 0 {
		d.hint = fmt.Sprintf("engine block hashes differ from kvindex's (%s): seed or algorithm; "+
			"waiting for a request's first block to tell which", cfg)
		return
	}
	var ek extraKeys
	eventExtras(&ek, ev, engine, 0)
	toks := ev.TokenIDs[:cfg.BlockSize]
	for _, algo := range HashAlgos {
		if algo == cfg.Algo {
			continue
		}
		alt := a.altHasher(KeyConfig{Algo: algo, Seed: cfg.Seed, BlockSize: cfg.BlockSize})
		if alt == nil {
			continue
		}
		var dg [32]byte
		var err error
		ps.buf, dg, err = alt.digest(ps.buf, alt.none[:alt.dlen], toks, &ek)
		if err == nil && uint64(keyOf(&dg, alt.dlen)) == eh {
			ps.hintFinal = true
			d.hint = fmt.Sprintf("hash algorithm: the engine hashes with %s but kvindex is configured with %s; "+
				"set --prefix-caching-hash-algo or kvindex's algorithm to agree", algo, cfg.Algo)
			return
		}
	}
	ps.hintFinal = true
	d.hint = fmt.Sprintf("seed: a request's first block differs with every algorithm at seed %q; the engine's "+
		"PYTHONHASHSEED differs or is unset (vLLM then uses a random NONE_HASH); set PYTHONHASHSEED=%s on the engine "+
		"or kvindex's seed to the engine's (less likely: LoRA/cache_salt/multimodal extra keys not published)", cfg.Seed, cfg.Seed)
}

func (a *Applier) altHasher(cfg KeyConfig) *Hasher {
	a.altMu.Lock()
	defer a.altMu.Unlock()
	if h := a.alt[cfg]; h != nil {
		return h
	}
	h, err := NewHasher(cfg)
	if err != nil { // cannot happen: cfg comes from a valid Hasher
		return nil
	}
	a.alt[cfg] = h
	return h
}
