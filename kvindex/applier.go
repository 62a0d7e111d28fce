package kvindex

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Default bounds of the applier's tables (see parity_cache.go).
const (
	// DefaultDigestCacheSize is the per-model digest cache (engine hash -> our
	// 32-byte digest): ~42 bytes per entry, so ~11 MB per model.
	DefaultDigestCacheSize = 1 << 18
	// DefaultAliasCacheSize is the per-pod alias table (engine hash -> our key),
	// allocated only for pods that need it (parity mismatch, SGLang): ~18 bytes
	// per entry, so ~4.7 MB per such pod.
	DefaultAliasCacheSize = 1 << 18
)

// ApplierConfig wires an Applier.
type ApplierConfig struct {
	Index    Index
	Interner *Interner
	Hashers  *HasherSet
	// DigestCacheSize bounds each model's digest cache (entries; 0 = default).
	DigestCacheSize int
	Metrics         *Metrics     // nil = private, unregistered metrics
	Logger          *slog.Logger // nil = discard
	// AliasCacheSize bounds each aliased pod's engine-hash -> own-key table
	// (entries; 0 = default). An addition to the shared contract.
	AliasCacheSize int
	// CopyTableSize bounds each vLLM pod's copy-count table and
	// GroupMaskTableSize each multi-group pod's group-mask table (entries;
	// 0 = default; see applier_tables.go).
	CopyTableSize      int
	GroupMaskTableSize int
	// Limits bound how many of those tables exist (applier_limits.go).
	Limits ApplierLimits
	// Share is the index's per-pod entry accounting, which Limits.PodShare
	// enforces; required when PodShare > 0. It is handed over explicitly
	// (not discovered on Index) so that wrapping the index cannot lose it.
	Share ShareAccounting
}

// PodStats is one (pod, DP rank)'s view from the applier.
type PodStats struct {
	Pod                                        string
	DPRank                                     int
	Model                                      string
	Engine                                     Engine
	EventsApplied, BlocksStored, BlocksRemoved uint64
	Clears                                     uint64
	// Snapshots are states replaced by an engine snapshot (BlockSnapshot).
	Snapshots                                         uint64
	LastEvent                                         time.Time
	ParityMatches, ParityMismatches, ParityUnverified uint64
	ParityHint                                        string
	// UnverifiedReason is why the latest unverified block could not be
	// checked (see the reason label of kvindexd_parity_unverified_total).
	UnverifiedReason string
	// ParitySampledOut: blocks indexed unverified because the pod had proven
	// its configuration and was being sampled (parity_sampling.go).
	ParitySampledOut uint64
	IndexErrors      uint64
	Untrusted        bool
	// RemoteBlocks are stored blocks with locality REMOTE: held for the pod
	// elsewhere, so not indexed as its own cache.
	RemoteBlocks uint64
	// GroupSkippedBlocks are blocks of sliding-window, mamba and other
	// groups that do not bound a prefix match, so are not indexed.
	GroupSkippedBlocks uint64
	// CopiesKept are removals that left the block indexed because another
	// physical copy remains (remaining_copy_counts or our own count).
	CopiesKept uint64
	// FullAttentionGroups is how many full-attention KV-cache groups the pod
	// has shown (0 until it names one: a single group is assumed).
	FullAttentionGroups int
}

// Applier applies decoded engine batches to an Index (it is the BatchSink of
// kvevents). For each BlockStored that carries token ids it recomputes the
// block keys and compares them with the engine's hashes (live parity check):
//
//   - match: the block is indexed under the engine hash (= our key);
//   - mismatch on a pod that never matched (its seed, algorithm or block size
//     differs): the block is indexed under OUR key, so routers that hash
//     prompts with our configuration still find it, and the engine hash is
//     aliased to our key so BlockRemoved (which carries only engine hashes)
//     still removes it. The pod gets a parity hint naming the likely cause.
//   - mismatch on a pod whose other blocks match: the engine hashed extra keys
//     it did not publish (multimodal, cache_salt); its hash is indexed as is.
//   - unverified (no token ids, parent digest unknown, extra keys unknown):
//     indexed under the engine hash, or under our key if it is aliased.
//
// SGLang hashes are never vLLM's, so SGLang blocks are always indexed under
// our key computed from their token ids (and aliased); blocks we cannot key
// are not indexed.
//
// What is indexed as the pod's own cache follows the engines' semantics
// (see applier_tables.go for the bounded tables behind the last two):
//
//   - locality REMOTE blocks are held for the pod elsewhere: not indexed,
//     counted (PodStats.RemoteBlocks);
//   - only full-attention KV-cache groups bound a prefix match: blocks of
//     sliding-window, mamba and other groups are counted, not indexed, so a
//     sliding window dropping old blocks never shortens a match; with several
//     full-attention groups a block is indexed while every one holds it and
//     removed when any drops it. Groups are folded into group 0 in the index;
//   - a hash stored twice is two physical copies: a removal keeps the block
//     while remaining_copy_counts says copies remain, or, without that field
//     (vLLM before it), while our own count of GPU copies does.
//
// Error contract: an Index error is counted, the pod is marked untrusted and
// the rest of the batch is dropped. Before the next batch of an untrusted pod
// the applier clears the pod in the index; only when that succeeds is the pod
// trusted again and its state rebuilt from new events.
//
// Memory is bounded: per model one digest cache (DigestCacheSize entries), per
// aliased pod one alias table (AliasCacheSize entries), per vLLM pod one copy
// table (CopyTableSize), per pod with several full-attention groups one group
// mask table (GroupMaskTableSize), per pod at most 256 group descriptions and
// a key scratch buffer as large as its largest event, and a few alternate
// Hashers for diagnosis (at most three per distinct KeyConfig).
type Applier struct {
	idx      Index
	in       *Interner
	hashers  *HasherSet
	m        *Metrics
	log      *slog.Logger
	dcSize   int
	aliasCap int
	copyCap  int
	maskCap  int

	mu      sync.RWMutex
	pods    map[podKey]*podState
	digests map[ModelID]*digestCache

	altMu sync.Mutex
	alt   map[KeyConfig]*Hasher

	lim limitState

	// untrustedIDs mirrors the pods whose index state is not trusted, so the
	// read path can leave them out of scores (Trusted) without touching the
	// per-pod state; nUntrusted lets it skip the lookup when there are none.
	untrustedMu  sync.RWMutex
	untrustedIDs map[PodID]struct{}
	nUntrusted   atomic.Int32
}

type podKey struct {
	name string
	rank int
}

// podState: the fields above mu belong to the goroutine applying the pod's
// batches (kvevents applies one pod's batches one at a time, in order); st is
// what PodStats reads, updated under mu once per batch.
type podState struct {
	id   PodID
	name string
	rank int

	modelName string
	modelID   ModelID
	hasher    *Hasher
	dc        *digestCache

	untrusted bool
	alias     *aliasTable // nil until the pod first needs aliasing
	// aliasOwner counts alias tables against ApplierLimits.MaxAliasTables.
	aliasOwner *limitState
	overShare  bool   // logged that the pod reached its PodShare
	keys       []Key  // scratch for Add/Remove
	buf        []byte // scratch for serialisation
	hintFinal  bool   // the parity hint names a definite cause
	// everMatched: some block of this pod matched, so a mismatch means unseen
	// extra keys, not a configuration difference.
	everMatched bool
	loggedHint  string
	parity      paritySampler // full checking or sampling (parity_sampling.go)

	// groups is what the pod said of its KV-cache groups (index = group_idx,
	// at most maxGroups); fullBit numbers its full-attention groups for the
	// group mask (0 = not full or not seen).
	groups  []GroupKind
	named   []bool
	fullBit []uint8
	nFull   int
	// copies counts physical copies (nil once the pod sends
	// remaining_copy_counts, or for engines that never duplicate); masks
	// tracks which full-attention groups hold a block (nil unless nFull > 1).
	copies          *countTable
	copiesAuthority bool
	masks           *countTable

	// applyMu serialises Apply and Recover on one pod: it guards the fields
	// above mu. kvevents already applies a pod's batches one at a time, so
	// the lock is uncontended except while Recover runs.
	applyMu sync.Mutex

	mu sync.Mutex
	st PodStats
}

// batchDelta counts one batch, added to the pod's stats and the metrics at once.
type batchDelta struct {
	events                          [BlockSnapshot + 1]uint64
	stored, removed, unkeyed        uint64
	matches, mismatches, unverified uint64
	unverifiedBy                    [numUnverifiedReasons]uint64
	lastUnverified                  unverifiedReason
	remote, groupSkipped            uint64
	copiesKept, tableEvictions      uint64
	sampledOut                      uint64
	indexErrors, unresolved         uint64
	recoveries                      uint64
	hint                            string
}

// unverifiedReason says why a block's hash could not be recomputed.
type unverifiedReason uint8

const (
	unverifiedNone unverifiedReason = iota
	unverifiedNoTokens
	unverifiedTokenCount // token_ids is not block_size tokens per block
	unverifiedPartialBlock
	unverifiedBlockSize // SGLang page size differs from the block size
	unverifiedParent    // parent digest unknown (not seen, or evicted)
	unverifiedExtraKeys // an extra key we cannot reproduce (typed key, float...)
	unverifiedLoraName  // LoRA request without lora_name or extra_keys
	numUnverifiedReasons
)

var unverifiedNames = [numUnverifiedReasons]string{"", "no_tokens", "token_count", "partial_block", "block_size",
	"parent_unknown", "extra_keys", "lora_name_missing"}

func (d *batchDelta) unverify(r unverifiedReason, n uint64) {
	d.unverified += n
	d.unverifiedBy[r] += n
	d.lastUnverified = r
}

// NewApplier returns an Applier. Index, Interner and Hashers are required;
// a limit that cannot be enforced (PodShare without Share) is an error.
func NewApplier(cfg ApplierConfig) (*Applier, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DigestCacheSize <= 0 {
		cfg.DigestCacheSize = DefaultDigestCacheSize
	}
	if cfg.AliasCacheSize <= 0 {
		cfg.AliasCacheSize = DefaultAliasCacheSize
	}
	if cfg.CopyTableSize <= 0 {
		cfg.CopyTableSize = DefaultCopyTableSize
	}
	if cfg.GroupMaskTableSize <= 0 {
		cfg.GroupMaskTableSize = DefaultGroupMaskTableSize
	}
	a := &Applier{
		idx: cfg.Index, in: cfg.Interner, hashers: cfg.Hashers, m: cfg.Metrics, log: cfg.Logger,
		dcSize: cfg.DigestCacheSize, aliasCap: cfg.AliasCacheSize, copyCap: cfg.CopyTableSize, maskCap: cfg.GroupMaskTableSize,
		pods: map[podKey]*podState{}, digests: map[ModelID]*digestCache{}, alt: map[KeyConfig]*Hasher{},
		untrustedIDs: map[PodID]struct{}{},
	}
	if err := a.initLimits(cfg.Limits, cfg.Share); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Applier) pod(b *Batch) *podState {
	k := podKey{b.Pod, b.DPRank}
	a.mu.RLock()
	ps := a.pods[k]
	a.mu.RUnlock()
	if ps != nil {
		return ps
	}
	id := a.in.Pod(b.Pod, b.DPRank)
	a.mu.Lock()
	defer a.mu.Unlock()
	if ps = a.pods[k]; ps == nil {
		ps = &podState{id: id, name: b.Pod, rank: b.DPRank}
		ps.st.Pod, ps.st.DPRank = b.Pod, b.DPRank
		a.pods[k] = ps
	}
	return ps
}

// bindModel caches the model's id, hasher and digest cache on the pod.
func (a *Applier) bindModel(ps *podState, model string) {
	if ps.hasher != nil && ps.modelName == model {
		return
	}
	id := a.in.Model(model)
	dc := a.digestCacheFor(ps, id)
	if ps.hasher != nil { // the pod now serves another model: start parity afresh
		ps.resetParity()
	}
	ps.modelName, ps.modelID, ps.hasher, ps.dc = model, id, a.hashers.For(model), dc
}

// resetParity forgets what the pod's parity check concluded. Called when the
// pod's cache is wiped (AllBlocksCleared: often an engine restart, maybe with
// a new seed) or it changes model, so a stale hint does not outlive its cause.
func (ps *podState) resetParity() {
	ps.hintFinal, ps.everMatched = false, false
	ps.dropAlias()
	ps.parity.reset()
	ps.mu.Lock()
	ps.st.ParityHint = ""
	ps.mu.Unlock()
}

// resetHolding forgets the copy counts and group masks: after a clear the
// pod holds nothing. What it said of its groups stays (same engine config).
func (ps *podState) resetHolding() {
	ps.copies, ps.masks = nil, nil
}

// Apply implements BatchSink.
func (a *Applier) Apply(ctx context.Context, b *Batch) {
	start := time.Now()
	ps := a.pod(b)
	ps.applyMu.Lock()
	defer ps.applyMu.Unlock()
	a.bindModel(ps, b.Model)
	var d batchDelta
	wasUntrusted := ps.untrusted
	if ps.untrusted {
		if err := a.idx.ClearPod(ctx, ps.id); err != nil {
			d.indexErrors++
			a.log.Debug("index still failing; dropping batch of untrusted pod", "pod", ps.name, "dp_rank", ps.rank, "err", err)
			a.finish(ps, b, &d, start, wasUntrusted)
			return
		}
		ps.untrusted = false
		ps.resetHolding()
		ps.parity.reset()
		d.recoveries++
		a.log.Info("pod cleared after index error; trusted again, rebuilding from new events", "pod", ps.name, "dp_rank", ps.rank)
	}
	for i := range b.Events {
		ev := &b.Events[i]
		var err error
		switch ev.Kind {
		case BlockStored:
			err = a.stored(ctx, ps, b.Engine, ev, &d)
		case BlockRemoved:
			err = a.removed(ctx, ps, b.Engine, ev, &d)
		case AllBlocksCleared:
			if err = a.idx.ClearPod(ctx, ps.id); err == nil {
				d.hint = ""
				ps.resetParity()
				ps.resetHolding()
			}
		case BlockSnapshot:
			err = a.snapshot(ctx, ps, b.Engine, ev, &d)
		default:
			continue // decoders do not produce other kinds; nothing to apply
		}
		if err != nil {
			d.indexErrors++
			ps.untrusted = true
			a.log.Warn("index error: pod marked untrusted, rest of batch dropped; it is cleared and rebuilt on its next batch",
				"pod", ps.name, "dp_rank", ps.rank, "event", ev.Kind.String(), "dropped_events", len(b.Events)-i-1, "err", err)
			break
		}
		d.events[ev.Kind]++
	}
	a.finish(ps, b, &d, start, wasUntrusted)
}

func (a *Applier) finish(ps *podState, b *Batch, d *batchDelta, start time.Time, wasUntrusted bool) {
	var n uint64
	for _, c := range d.events {
		n += c
	}
	ps.mu.Lock()
	st := &ps.st
	st.Model, st.Engine = b.Model, b.Engine
	st.EventsApplied += n
	st.BlocksStored += d.stored
	st.BlocksRemoved += d.removed
	st.Clears += d.events[AllBlocksCleared]
	st.Snapshots += d.events[BlockSnapshot]
	st.LastEvent = start
	st.ParityMatches += d.matches
	st.ParityMismatches += d.mismatches
	st.ParityUnverified += d.unverified
	if d.lastUnverified != unverifiedNone {
		st.UnverifiedReason = unverifiedNames[d.lastUnverified]
	}
	st.RemoteBlocks += d.remote
	st.GroupSkippedBlocks += d.groupSkipped
	st.CopiesKept += d.copiesKept
	st.FullAttentionGroups = ps.nFull
	st.ParitySampledOut += d.sampledOut
	if d.hint != "" {
		st.ParityHint = d.hint
	}
	st.IndexErrors += d.indexErrors
	st.Untrusted = ps.untrusted
	ps.mu.Unlock()
	if ps.untrusted != wasUntrusted {
		a.setUntrusted(ps, ps.untrusted)
	}
	if d.hint != "" && d.hint != ps.loggedHint {
		ps.loggedHint = d.hint
		a.log.Warn("block hash parity mismatch: indexing this pod under kvindex's own keys",
			"pod", ps.name, "dp_rank", ps.rank, "model", b.Model, "hint", d.hint)
	}
	a.m.flush(d, time.Since(start))
}

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

// maxGroups bounds the KV-cache groups a pod may describe; maxFullGroups
// the full-attention ones a group mask can track.
const (
	maxGroups     = 256
	maxFullGroups = 16
)

// storeGroup learns what ev says of its group and reports whether the group
// bounds a prefix match (full attention, or not described: older engines)
// and, when the pod has several full-attention groups, the group's mask bit.
func (ps *podState) storeGroup(ev *Event) (bounds bool, bit uint16) {
	g := ev.GroupIdx
	if g < 0 || g >= maxGroups {
		return false, 0
	}
	for len(ps.groups) <= g {
		ps.groups = append(ps.groups, GroupKindUnknown)
		ps.named = append(ps.named, false)
		ps.fullBit = append(ps.fullBit, 0)
	}
	kind := ev.GroupKind
	if kind == GroupKindUnknown && ev.SlidingWindow > 0 {
		kind = GroupSlidingWindow
	}
	if (kind != GroupKindUnknown && kind != ps.groups[g]) || !ps.named[g] {
		if kind != GroupKindUnknown {
			ps.groups[g] = kind
		}
		ps.named[g] = true
		ps.numberGroups()
	}
	return ps.groupBit(g)
}

// numberGroups gives every bounding group (full or undescribed) a mask bit,
// in group order. A change of the full-group set forgets the masks: they
// were taken against another set.
func (ps *podState) numberGroups() {
	n := 0
	for g, k := range ps.groups {
		ps.fullBit[g] = 0
		if (k == GroupFullAttention || k == GroupKindUnknown) && n < maxFullGroups && ps.named[g] {
			n++
			ps.fullBit[g] = uint8(n)
		}
	}
	if n != ps.nFull {
		ps.nFull, ps.masks = n, nil
	}
}

func (ps *podState) groupBit(g int) (bounds bool, bit uint16) {
	switch k := ps.groups[g]; {
	case k != GroupFullAttention && k != GroupKindUnknown:
		return false, 0
	case ps.fullBit[g] == 0:
		return false, 0 // beyond maxFullGroups
	case ps.nFull > 1:
		return true, 1 << (ps.fullBit[g] - 1)
	}
	return true, 0
}

// removeGroup is storeGroup for a removal: it learns nothing; a group never
// described is treated as bounding (the removal is applied, the safe way).
func (ps *podState) removeGroup(ev *Event) (bounds bool, bit uint16) {
	g := ev.GroupIdx
	if g < 0 || g >= maxGroups {
		return false, 0
	}
	if g >= len(ps.groups) || !ps.named[g] {
		return true, 0
	}
	if k := ps.groups[g]; k == GroupFullAttention || k == GroupKindUnknown {
		_, bit = ps.groupBit(g)
		return true, bit
	}
	return false, 0
}

// holdStored filters the keys of a stored event down to those that become
// indexed: a second physical copy of a block is only counted (vLLM), and
// with several full-attention groups a block waits until all hold it.
func (a *Applier) holdStored(ps *podState, engine Engine, ev *Event, bit uint16, keys []Key, d *batchDelta) []Key {
	// Copies are counted on the GPU tier only: vLLM's block pool announces
	// a hash once per physical block, so a second store is a second copy.
	// Connectors (CPU offload, LMCache) may announce a block again without
	// a second copy; counting those would keep a removed block indexed.
	track := engine == EngineVLLM && !ps.copiesAuthority && ev.Medium == TierGPU
	if !track && bit == 0 {
		return keys
	}
	all := uint16(1)<<ps.nFull - 1
	out := keys[:0]
	for _, k := range keys {
		if track {
			if ps.copies == nil {
				ps.copies = newCountTable(a.copyCap)
			}
			ck := entryKey(k, ev.Medium, ev.GroupIdx)
			c, held := ps.copies.get(ck)
			if c < math.MaxUint16 {
				c++
			}
			if ps.copies.put(ck, c) {
				d.tableEvictions++
			}
			if held {
				continue // another copy is indexed already
			}
		}
		if bit != 0 {
			if ps.masks == nil {
				ps.masks = newCountTable(a.maskCap)
			}
			mk := entryKey(k, ev.Medium, -1)
			m, _ := ps.masks.get(mk)
			m |= bit
			if ps.masks.put(mk, m) {
				d.tableEvictions++
			}
			if m != all {
				continue
			}
		}
		out = append(out, k)
	}
	return out
}

// keepOnRemove reports whether removing copy i of key k leaves the block
// held: the engine says copies remain, or our count does. It also clears
// k's group bit.
func (a *Applier) keepOnRemove(ps *podState, engine Engine, ev *Event, i int, bit uint16, k Key, d *batchDelta) bool {
	switch {
	case ev.HasRemainingCopies:
		if i < len(ev.RemainingCopies) && ev.RemainingCopies[i] > 0 {
			d.copiesKept++
			return true
		}
	case engine == EngineVLLM && ps.copies != nil:
		ck := entryKey(k, ev.Medium, ev.GroupIdx)
		if c, held := ps.copies.get(ck); held && c > 1 {
			ps.copies.put(ck, c-1)
			d.copiesKept++
			return true
		}
		ps.copies.del(ck)
	}
	if bit != 0 && ps.masks != nil {
		// Any full-attention group dropping the block ends the match there.
		mk := entryKey(k, ev.Medium, -1)
		if m, ok := ps.masks.get(mk); ok {
			if m &^= bit; m == 0 {
				ps.masks.del(mk)
			} else {
				ps.masks.put(mk, m)
			}
		}
	}
	return false
}

// snapshot replaces what the index holds for the pod with ev.BlockHashes,
// the pod's whole state at one point (SGLang's snapshot protocol). Snapshot
// records carry SGLang hashes without token ids: a hash is indexed under the
// key its earlier BlockStored gave it (alias), and one never seen stored is
// counted unkeyed. The engine's cache being unchanged, parity conclusions and
// aliases are kept. The records name no medium: they are indexed on
// ev.Medium (GPU). Clear then add is not atomic for readers: a score in
// between sees the pod empty (an under-report, never a stale block).
func (a *Applier) snapshot(ctx context.Context, ps *podState, engine Engine, ev *Event, d *batchDelta) error {
	if err := a.idx.ClearPod(ctx, ps.id); err != nil {
		return err
	}
	ps.resetHolding()
	keys := ps.keys[:0]
	for _, eh := range ev.BlockHashes {
		if ps.alias != nil {
			if k, ok := ps.alias.get(eh); ok {
				keys = append(keys, k)
				continue
			}
		}
		if engine == EngineSGLang {
			d.unkeyed++
			continue
		}
		keys = append(keys, Key(eh))
	}
	ps.keys = keys
	if len(keys) == 0 {
		return nil
	}
	if err := a.idx.Add(ctx, ps.modelID, ps.id, ev.Medium, 0, keys); err != nil {
		return err
	}
	d.stored += uint64(len(keys))
	return nil
}

func (a *Applier) removed(ctx context.Context, ps *podState, engine Engine, ev *Event, d *batchDelta) error {
	bounds, bit := ps.removeGroup(ev)
	switch {
	case ev.Remote:
		d.remote += uint64(len(ev.BlockHashes))
		return nil
	case !bounds:
		d.groupSkipped += uint64(len(ev.BlockHashes))
		return nil
	}
	if ev.HasRemainingCopies && !ps.copiesAuthority {
		// The engine counts copies itself: ours are no longer needed.
		ps.copiesAuthority, ps.copies = true, nil
	}
	keys := ps.keys[:0]
	for i, eh := range ev.BlockHashes {
		k := Key(eh)
		if ps.alias != nil {
			var ok bool
			if k, ok = ps.alias.get(eh); !ok {
				d.unresolved++
				if engine == EngineSGLang {
					continue
				}
				k = Key(eh)
			}
			// Keep the alias: the block may still be held on another tier.
		} else if engine == EngineSGLang {
			d.unresolved++
			continue
		}
		if a.keepOnRemove(ps, engine, ev, i, bit, k, d) {
			continue
		}
		keys = append(keys, k)
	}
	ps.keys = keys
	if len(keys) == 0 {
		return nil
	}
	if err := a.idx.Remove(ctx, ps.modelID, ps.id, ev.Medium, 0, keys); err != nil {
		return err
	}
	d.removed += uint64(len(keys))
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

// PodStats returns every (pod, DP rank) seen, sorted by pod then rank.
func (a *Applier) PodStats() []PodStats {
	a.mu.RLock()
	out := make([]PodStats, 0, len(a.pods))
	for _, ps := range a.pods {
		ps.mu.Lock()
		out = append(out, ps.st)
		ps.mu.Unlock()
	}
	a.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod != out[j].Pod {
			return out[i].Pod < out[j].Pod
		}
		return out[i].DPRank < out[j].DPRank
	})
	return out
}

// setUntrusted records a pod's trust transition for Trusted and the gauge.
func (a *Applier) setUntrusted(ps *podState, untrusted bool) {
	a.untrustedMu.Lock()
	if untrusted {
		a.untrustedIDs[ps.id] = struct{}{}
		a.m.untrustedPods.Inc()
	} else {
		delete(a.untrustedIDs, ps.id)
		a.m.untrustedPods.Dec()
	}
	a.nUntrusted.Store(int32(len(a.untrustedIDs)))
	a.untrustedMu.Unlock()
}

// Trusted reports whether what the index holds for pod can be served. A pod
// is untrusted from an index error until the applier has cleared it: scores
// must leave it out meanwhile, or entries written before a lost removal would
// be served as if they were still cached.
func (a *Applier) Trusted(pod PodID) bool {
	if a.nUntrusted.Load() == 0 {
		return true
	}
	a.untrustedMu.RLock()
	_, bad := a.untrustedIDs[pod]
	a.untrustedMu.RUnlock()
	return !bad
}

// Recover clears every untrusted pod in the index and trusts it again when
// the clear succeeds. Apply does the same before an untrusted pod's next
// batch; Recover covers pods that stay quiet after the index comes back.
// It returns how many pods were recovered and the last index error.
func (a *Applier) Recover(ctx context.Context) (int, error) {
	if a.nUntrusted.Load() == 0 {
		return 0, nil
	}
	a.mu.RLock()
	var todo []*podState
	for _, ps := range a.pods {
		if !a.Trusted(ps.id) {
			todo = append(todo, ps)
		}
	}
	a.mu.RUnlock()
	var n int
	var lastErr error
	for _, ps := range todo {
		ps.applyMu.Lock()
		if ps.untrusted {
			if err := a.idx.ClearPod(ctx, ps.id); err != nil {
				lastErr = err
			} else {
				ps.untrusted = false
				ps.resetHolding()
				ps.mu.Lock()
				ps.st.Untrusted = false
				ps.mu.Unlock()
				a.setUntrusted(ps, false)
				a.m.recoveryClears.Inc()
				n++
				a.log.Info("pod cleared after index error; trusted again, rebuilding from new events", "pod", ps.name, "dp_rank", ps.rank)
			}
		}
		ps.applyMu.Unlock()
	}
	return n, lastErr
}

// RunRecovery calls Recover every interval until ctx is done.
func (a *Applier) RunRecovery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := a.Recover(ctx); err != nil {
				a.log.Debug("index still failing; untrusted pods wait", "err", err)
			}
		}
	}
}
