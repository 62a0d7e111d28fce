package applier

import (
	"context"
	"fmt"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// eventExtras sets extraKeys to block i's extra keys. ok=false means they cannot be
// known: a LoRA request whose engine sent its id but neither lora_name nor
// extra_keys (vLLM v0.12 to early 2026 hashed the name).
func eventExtras(extraKeys *blockkeys.ExtraKeys, ev *event.Event, engine blockkeys.Engine, i int) bool {
	if len(ev.ExtraKeys) > 0 {
		var tuple []any // empty = None: vLLM never hashes an empty tuple
		if i < len(ev.ExtraKeys) {
			tuple = ev.ExtraKeys[i]
		}
		extraKeys.SetTuple(tuple)
		return true
	}
	if ev.LoraName == "" && ev.HasLoraID && ev.LoraID != 0 {
		return false
	}
	// vLLM publishes no cache_salt: a salted block's hash cannot be
	// recomputed from its event and mismatches (see checkedKey).
	x := blockkeys.RequestExtras{LoraName: ev.LoraName}
	// cache_salt only enters a request's first block: the one without parent.
	extraKeys.ForRequest(x, i == 0 && !ev.HasParent)
	return true
}

// stored indexes one BlockStored event in two steps: storedKeys decides the
// keys and updates what the applier keeps per pod; addStored writes them,
// the only index call. The decisions are thus the same whatever the index
// (memory, Redis, a failing one) and can be tested without one.
func (a *Applier) stored(ctx context.Context, pod *podState, engine blockkeys.Engine, ev *event.Event, d *batchDelta) error {
	mu := a.lockShare(pod)
	keys, countHeld := a.storedKeys(pod, engine, ev, d)
	err := a.addStored(ctx, pod, ev, keys, countHeld, d)
	unlockShare(mu)
	if err != nil {
		return err
	}
	// A reuse report (kv_cache_report_mode="full") re-stores blocks the pod
	// holds, so it adds no key; the session still ran there.
	if ev.SessionID != "" && len(ev.BlockHashes) > 0 {
		last := blockkeys.Key(ev.BlockHashes[len(ev.BlockHashes)-1])
		if len(keys) > 0 {
			last = keys[len(keys)-1]
		}
		a.sessions.record(pod.id, ev.SessionID, last)
	}
	return nil
}

// storedKeys returns the keys ev adds to the index, in the pod's reused key
// buffer. It writes nothing to the index: it updates what the applier keeps
// per pod (groups, parity verdicts and hint, digest cache, aliases, copy
// counts, group masks) and counts into d. countHeld says that the copies of
// these keys are to be counted from the index's answer instead (holdStored):
// addStored then counts a copy for each key the pod already held.
func (a *Applier) storedKeys(pod *podState, engine blockkeys.Engine, ev *event.Event, d *batchDelta) (keys []blockkeys.Key, countHeld bool) {
	n := len(ev.BlockHashes)
	if n == 0 {
		return nil, false
	}
	bounds, bit := pod.storeGroup(ev)
	switch {
	case ev.Remote:
		d.remote += uint64(n)
		return nil, false
	case !bounds:
		d.groupSkipped += uint64(n)
		return nil, false
	}
	keys = a.blockKeys(pod, engine, ev, d)
	if a.answered != nil {
		pod.answered = append(pod.answered, keys...)
	}
	keys, countHeld = a.holdStored(pod, engine, ev, bit, keys, d)
	keys = a.trimToShare(pod, keys)
	pod.keys = keys
	return keys, countHeld
}

// blockKeys maps each block of ev to the key it is indexed under, as the
// parity check decides (see Applier): a block we can rehash gets its
// verdict from checkedKey, one we cannot from uncheckedKey, and a pod being
// sampled (parity_sampling.go) has its hashes taken unchecked.
func (a *Applier) blockKeys(pod *podState, engine blockkeys.Engine, ev *event.Event, d *batchDelta) []blockkeys.Key {
	h := pod.hasher
	bs, dlen := h.Config().BlockSize, h.DigestLen()
	keys := pod.keys[:0]
	base, bsWrong := pod.verifiable(engine, ev, d)
	stride := bs // token ids per block: two per position when they are pairs
	if ev.Bigram {
		stride = 2 * bs
		if engine.Info().Scheme == blockkeys.SchemeSGLang {
			// The pod's pages are SGLang pair pages, checked or not: Pick
			// holds its speculative entries under the pair keys.
			a.podEngines.set(pod.id, blockkeys.EngineSGLangEAGLE)
		}
		if base == unverifiedNone {
			// Pairs that check out here are what a prompt's pair keys
			// (EngineSGLangEAGLE) find: score requests under them too.
			a.engines.Or(1 << blockkeys.EngineSGLangEAGLE)
		}
	}

	var parent [32]byte
	plen := dlen
	parentOK := true
	if !ev.HasParent {
		parent, plen = h.Root()
	} else {
		parentOK = pod.digests.get(ev.ParentHash, &parent)
	}
	if !pod.parity.check(base == unverifiedNone && parentOK) {
		// Sampled out: the engine's hashes (or their aliases) go in
		// unchecked, through the same copy, group and share accounting.
		return a.storedUnchecked(pod, ev, keys, d)
	}
	var extraKeys blockkeys.ExtraKeys
	for i, eh := range ev.BlockHashes {
		reason := base
		if reason == unverifiedNone && !parentOK {
			reason = unverifiedParent
		}
		if reason == unverifiedNone && !eventExtras(&extraKeys, ev, engine, i) {
			reason = unverifiedLoraName
		}
		if reason == unverifiedNone {
			var dg [32]byte
			var err error
			pod.buf, dg, err = h.BlockDigest(pod.buf, parent[:plen], ev.TokenIDs[i*stride:(i+1)*stride], &extraKeys)
			if err == nil {
				pod.digests.put(eh, &dg)
				parent, plen = dg, dlen
				keys = a.checkedKey(pod, engine, ev, i, eh, h.DigestKey(&dg), keys, d)
				continue
			}
			// an extra key we cannot serialise (OpaqueExtraKey, ...)
			reason = unverifiedExtraKeys
		}
		// Not computable here; the chain may resume if we know this block,
		// unless nothing in this event can be verified (no token ids, ...):
		// then no later block needs it, and the lookup is a cache miss per
		// block for nothing.
		if base == unverifiedNone {
			parentOK, plen = pod.digests.get(eh, &parent), dlen
		}
		if !bsWrong {
			d.unverify(reason, 1) // a block-size mismatch is counted once, in verifiable
		}
		keys = uncheckedKey(pod, eh, keys)
	}
	return keys
}

// verifiable reports why none of ev's blocks can be rehashed here
// (unverifiedNone: they may be), and whether the engine's block size differs
// from ours: those blocks are counted as mismatches (vLLM) here, once, and
// the pod gets the hint.
func (pod *podState) verifiable(engine blockkeys.Engine, ev *event.Event, d *batchDelta) (base unverifiedReason, bsWrong bool) {
	n, bs := len(ev.BlockHashes), pod.hasher.Config().BlockSize
	haveTokens := len(ev.TokenIDs) > 0
	width := 1 // token ids per position
	if ev.Bigram {
		width = 2
	}
	bsWrong = haveTokens && ev.BlockSize > 0 && ev.BlockSize != bs
	// A lone block shorter than the block size with exactly that many tokens
	// is a trailing partial page (SGLang), not a different configuration:
	// no hint from it.
	partial := bsWrong && n == 1 && ev.BlockSize < bs && len(ev.TokenIDs) == ev.BlockSize*width
	bsWrong = bsWrong && !partial
	switch {
	case !haveTokens:
		base = unverifiedNoTokens
	case ev.Bigram && !(engine.Info().Scheme == blockkeys.SchemeSGLang && pairsChain(ev.TokenIDs)):
		// Pairs hash as SGLang hashes them; from another engine, or
		// pairs [t_i, t_i+1] whose t_i+1 is not the next pair's t_i (no
		// prompt has them), they are not what a prompt's keys find.
		base = unverifiedBigram
	case partial:
		base = unverifiedPartialBlock
	case bsWrong:
		base = unverifiedBlockSize
	case len(ev.TokenIDs) != n*bs*width:
		base = unverifiedTokenCount
	}
	if bsWrong {
		d.mismatches += uint64(n) // counted here, not again as unverified
		if !pod.hintFinal {
			pod.hintFinal = true
			d.hint = fmt.Sprintf("block size: engine publishes block_size=%d but kvindex is configured with %d; "+
				"set the engine's --block-size (SGLang: --page-size, default 1) or kvindex's block size (per model) to agree",
				ev.BlockSize, bs)
		}
	}
	return base, bsWrong
}

// pairsChain reports whether flattened pairs (t0, t1, t1', t2, ...) are the
// bigrams of one token sequence: each pair's second token is the next pair's
// first.
func pairsChain(ids []uint32) bool {
	if len(ids)%2 != 0 {
		return false
	}
	for i := 1; i+1 < len(ids); i += 2 {
		if ids[i] != ids[i+1] {
			return false
		}
	}
	return true
}

// checkedKey appends the key of block i of ev, whose hash eh we recomputed
// as k, and records the parity verdict.
func (a *Applier) checkedKey(pod *podState, engine blockkeys.Engine, ev *event.Event, i int, eh uint64, k blockkeys.Key, keys []blockkeys.Key, d *batchDelta) []blockkeys.Key {
	switch {
	case uint64(k) == eh:
		d.matches++
		pod.everMatched = true
		pod.parity.matched()
		return append(keys, k)
	case pod.everMatched:
		// Other blocks of this pod match, so its seed, algorithm and
		// block size are right: the engine hashed extra keys it did not
		// publish (multimodal items, cache_salt without extra_keys).
		// Its hash is then the truth for this block; ours is not.
		d.mismatches++
		pod.parity.reset()
		if !pod.hintFinal {
			pod.hintFinal = true
			d.hint = "extra keys: some blocks match and others differ; the engine hashes extra keys " +
				"(multimodal, cache_salt, LoRA) it does not publish in extra_keys; those blocks are " +
				"indexed under the engine's hashes"
		}
		return append(keys, blockkeys.Key(eh))
	}
	d.mismatches++
	pod.parity.reset()
	if !a.aliasPut(pod, eh, k) {
		k = blockkeys.Key(eh) // removals must still find it
	}
	if !pod.hintFinal {
		a.diagnose(pod, ev, engine, i, eh, d)
	}
	return append(keys, k)
}

// uncheckedKey appends the key of a block whose hash we could not
// recompute: our key if its hash is aliased, else the engine's hash (every
// engine's hash is its key: see EngineInfo).
func uncheckedKey(pod *podState, eh uint64, keys []blockkeys.Key) []blockkeys.Key {
	if pod.alias != nil {
		if k, ok := pod.alias.get(eh); ok {
			return append(keys, k)
		}
	}
	return append(keys, blockkeys.Key(eh))
}

// addStored writes the keys storedKeys chose: the one index write of a
// BlockStored (and of a BlockSnapshot's records). With countHeld the index
// (a HeldAdder) reports which keys the pod already held on the tier, and
// each of those is one more copy (countHeldCopy); the others are stored.
func (a *Applier) addStored(ctx context.Context, pod *podState, ev *event.Event, keys []blockkeys.Key, countHeld bool, d *batchDelta) error {
	if len(keys) == 0 {
		return nil
	}
	if !countHeld {
		if err := a.idx.Add(ctx, pod.modelID, pod.id, ev.Medium, keys); err != nil {
			return err
		}
		d.stored += uint64(len(keys))
		return nil
	}
	if cap(pod.held) < len(keys) {
		pod.held = make([]bool, len(keys))
	}
	held := pod.held[:len(keys)]
	if err := a.heldAdder.AddHeld(ctx, pod.modelID, pod.id, ev.Medium, keys, held); err != nil {
		return err
	}
	again := 0
	for i, h := range held {
		if h {
			a.countHeldCopy(pod, keys[i], ev, d)
			again++
		}
	}
	d.stored += uint64(len(keys) - again)
	return nil
}

// hashesAs reports whether a root block of toks hashes to the engine's
// hash eh under cfg (an algorithm or seed other than ours): what the parity
// hint tries before naming the setting that differs.
func (a *Applier) hashesAs(pod *podState, cfg blockkeys.KeyConfig, toks []uint32, extraKeys *blockkeys.ExtraKeys, eh uint64) bool {
	alt := a.altHasher(cfg)
	if alt == nil {
		return false
	}
	var dg [32]byte
	var err error
	root, rootLen := alt.Root()
	pod.buf, dg, err = alt.BlockDigest(pod.buf, root[:rootLen], toks, extraKeys)
	return err == nil && uint64(alt.DigestKey(&dg)) == eh
}

// diagnose names the likely cause of a parity mismatch. On a request's first
// block (parent = NONE_HASH) it can tell algorithm from seed: it rehashes the
// block with the other algorithms and the same seed.
func (a *Applier) diagnose(pod *podState, ev *event.Event, engine blockkeys.Engine, i int, eh uint64, d *batchDelta) {
	h := pod.hasher
	cfg := h.Config()
	if engine.Info().Scheme != blockkeys.SchemeVLLM {
		// No algorithm or seed to choose: a page size that differs is
		// caught by verifiable; what is left is a fork that seeds or
		// namespaces its hash, or extra inputs the engine does not publish.
		d.hint = fmt.Sprintf("engine block hashes differ from %s's published hashing at block size %d: "+
			"the engine hashes inputs it does not publish (a fork seeding its root, a salt or LoRA); "+
			"its blocks are indexed under kvindex's keys", engine, cfg.BlockSize)
		pod.hintFinal = true
		return
	}
	if ev.HasParent || i != 0 {
		d.hint = fmt.Sprintf("engine block hashes differ from kvindex's (%s): seed or algorithm; "+
			"waiting for a request's first block to tell which", cfg)
		return
	}
	var extraKeys blockkeys.ExtraKeys
	eventExtras(&extraKeys, ev, engine, 0)
	toks := ev.TokenIDs[:cfg.BlockSize]
	// llm-d's publishers hash with their own function (FNV-64a over CBOR),
	// whatever the seed: no vLLM setting makes these match.
	for _, seed := range append([]string{cfg.Seed}, commonSeeds...) {
		if blockkeys.LLMDBlockHash(blockkeys.LLMDRoot(seed, pod.modelName), toks) == eh {
			pod.hintFinal = true
			d.hint = fmt.Sprintf("hash function: the engine publishes llm-d's block hashes (FNV-64a over CBOR, "+
				"llm-d-kv-cache's token processor, seed %q, model %q; llm-d-inference-sim), not vLLM's; no seed or "+
				"algorithm setting makes them equal; its blocks are indexed under kvindex's keys, which score by token ids",
				seed, pod.modelName)
			return
		}
	}
	for _, algo := range blockkeys.HashAlgos {
		if algo == cfg.Algo {
			continue
		}
		if a.hashesAs(pod, blockkeys.KeyConfig{Algo: algo, Seed: cfg.Seed, BlockSize: cfg.BlockSize}, toks, &extraKeys, eh) {
			pod.hintFinal = true
			d.hint = fmt.Sprintf("hash algorithm: the engine hashes with %s but kvindex is configured with %s; "+
				"set --prefix-caching-hash-algo or kvindex's algorithm to agree", algo, cfg.Algo)
			return
		}
	}
	// Same algorithm, the seeds engines commonly run with: the hint can then
	// name the setting and the value that differ.
	for _, seed := range commonSeeds {
		if seed == cfg.Seed {
			continue
		}
		if a.hashesAs(pod, blockkeys.KeyConfig{Algo: cfg.Algo, Seed: seed, BlockSize: cfg.BlockSize}, toks, &extraKeys, eh) {
			pod.hintFinal = true
			d.hint = fmt.Sprintf("seed: the engine hashes with seed %q (%s) but kvindex's --hash-seed is %q; "+
				"set --hash-seed %q (or the model's hash_seed)", seed, seedOrigin(seed), cfg.Seed, seed)
			return
		}
	}
	pod.hintFinal = true
	why := "the engine's PYTHONHASHSEED is another value"
	if cfg.Algo.RandomSeed() {
		why = fmt.Sprintf("vLLM seeds %s with random bytes when PYTHONHASHSEED is unset", cfg.Algo)
	}
	d.hint = fmt.Sprintf("seed: a request's first block differs with every algorithm at seed %q and with seeds %q: %s, "+
		"or PYTHONHASHSEED is unset on a vLLM older than the fixed default seed (PR #51875, random bytes then); "+
		"set PYTHONHASHSEED on the engine and kvindex's --hash-seed to the same value "+
		"(less likely: LoRA/cache_salt/multimodal extra keys not published)", cfg.Seed, commonSeeds, why)
}

// commonSeeds are the seeds diagnose tries on a request's first block:
// vLLM's default without PYTHONHASHSEED, the documented "0" and the empty
// string (PYTHONHASHSEED set but empty).
var commonSeeds = []string{blockkeys.DefaultSeed, "0", ""}

// seedOrigin says how an engine comes to hash with seed.
func seedOrigin(seed string) string {
	if seed == blockkeys.DefaultSeed {
		return "vLLM's default with PYTHONHASHSEED unset, since PR #51875, for the sha256 family"
	}
	return fmt.Sprintf("PYTHONHASHSEED=%q", seed)
}

func (a *Applier) altHasher(cfg blockkeys.KeyConfig) *blockkeys.Hasher {
	a.altMu.Lock()
	defer a.altMu.Unlock()
	if h := a.alt[cfg]; h != nil {
		return h
	}
	h, err := blockkeys.NewHasher(cfg)
	if err != nil { // cannot happen: cfg comes from a valid Hasher
		return nil
	}
	a.alt[cfg] = h
	return h
}
