package applier

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
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

// Config wires an Applier.
type Config struct {
	Index    kvindex.Index
	Interner *kvindex.Interner
	Hashers  *blockkeys.HasherSet
	// DigestCacheSize bounds each model's digest cache (entries; 0 = default).
	DigestCacheSize int
	Metrics         *Metrics     // nil = private, unregistered metrics
	Logger          *slog.Logger // nil = discard
	// AliasCacheSize bounds each aliased pod's engine-hash -> own-key table
	// (entries; 0 = default). An addition to the shared contract.
	AliasCacheSize int
	// CopyTableSize bounds each vLLM pod's copy-count table and
	// GroupMaskTableSize each multi-group pod's group-mask table (entries;
	// 0 = default; see tables.go).
	CopyTableSize      int
	GroupMaskTableSize int
	// HoldTableBytes bounds those tables' memory together (0 = default
	// DefaultHoldTableBytes; see tables.go).
	HoldTableBytes int64
	// Limits bound how many of those tables exist (limits.go).
	Limits Limits
	// Share is the index's per-pod entry accounting, which Limits.PodShare
	// enforces; required when PodShare > 0. It is handed over explicitly
	// (not discovered on Index) so that wrapping the index cannot lose it.
	Share ShareAccounting
	// Held, when set, adds stored blocks to the same index as Index while
	// reporting which keys the pod already held (the in-memory index):
	// the applier writes stored blocks through it and counts copies only
	// for those (holding.go); nil: through Index.Add, copies counted for
	// every block. Handed over explicitly, like Share: a wrapper of Index
	// that is not also given here is never bypassed.
	Held kvindex.HeldAdder
	// Answered, when set, is told after each batch which keys its
	// BlockStored and BlockRemoved events answered for the pod: the keys
	// the index holds them under (after aliasing), not the engine's hashes,
	// which differ for a pod whose hashing is not kvindexd's. Pick's
	// speculative entries are keyed as the index is, so they are dropped
	// by these. keys is the applier's buffer, valid during the call; it is
	// called with the pod's batches serialised.
	Answered func(ctx context.Context, b *event.Batch, keys []blockkeys.Key)
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
// Each engine's blocks are checked against that engine's own hashing
// (HasherSet.ForEngine): an SGLang pod's keys are SGLang's page hashes, which
// the request path computes for SGLang pods as it computes vLLM's for vLLM
// pods, so blocks known only by hash (a snapshot) score by token ids too.
//
// What is indexed as the pod's own cache follows the engines' semantics
// (see tables.go for the bounded tables behind the last two):
//
//   - locality REMOTE blocks are held for the pod elsewhere: not indexed,
//     counted (PodStats.RemoteBlocks);
//   - only full-attention KV-cache groups bound a prefix match: blocks of
//     sliding-window, mamba and other groups are counted, not indexed, so a
//     sliding window dropping old blocks never shortens a match; with several
//     full-attention groups a block is indexed while every one holds it and
//     removed when any drops it. The index knows no groups: a block is
//     held or not;
//   - a hash stored twice is two physical copies (GPU) or two chunks holding
//     it (vLLM's offloading connector, CPU and storage): a removal keeps the
//     block while remaining_copy_counts says copies remain, or, without that
//     field, while our own count of its announcements on that tier does.
//
// Error contract: an Index error is counted, the pod is marked untrusted and
// the rest of the batch is dropped. Before the next batch of an untrusted pod
// the applier clears the pod in the index; only when that succeeds is the pod
// trusted again and its state rebuilt from new events. Apply reports it
// (ApplyOutcome); the applier keeps no answer to "may this pod be served":
// the caller that records the outcome does (kvevents' stream state).
//
// Memory is bounded: per model one digest cache (DigestCacheSize entries), per
// aliased pod one alias table (AliasCacheSize entries), per vLLM pod one copy
// table (growing with its blocks up to CopyTableSize), per pod with several
// full-attention groups one group mask table (up to GroupMaskTableSize), per pod at most 256 group descriptions and
// a key scratch buffer as large as its largest event, and a few alternate
// Hashers for diagnosis (at most three per distinct KeyConfig).
type Applier struct {
	idx kvindex.Index
	// heldAdder is Config.Held: copies are then counted only for blocks
	// stored again (holding.go). nil: counted for every block.
	heldAdder kvindex.HeldAdder
	in        *kvindex.Interner
	hashers   *blockkeys.HasherSet
	m         *Metrics
	log       *slog.Logger
	dcSize    int
	aliasCap  int
	copyCap   int
	maskCap   int
	tables    tableBudget // all copy-count and group-mask tables

	mu      sync.RWMutex
	pods    map[podKey]*podState
	digests map[kvindex.ModelID]*digestCache

	altMu sync.Mutex
	alt   map[blockkeys.KeyConfig]*blockkeys.Hasher

	lim limitState

	answered func(ctx context.Context, b *event.Batch, keys []blockkeys.Key)

	sessions sessionTable // BlockStored.session_id per pod (sessions.go)

	// engines: bit e set once a batch of Engine e was applied.
	engines atomic.Uint32
	// podEngines: the engine whose keys each pod is indexed under
	// (pod_engine.go).
	podEngines podEngines
}

type podKey struct {
	name string
	rank int
}

// podState: the fields above mu belong to the goroutine applying the pod's
// batches (kvevents applies one pod's batches one at a time, in order); st is
// what PodStats reads, updated under mu once per batch.
type podState struct {
	id   kvindex.PodID
	name string
	rank int

	modelName string
	modelID   kvindex.ModelID
	hasher    *blockkeys.Hasher
	digests   *digestCache

	untrusted bool
	alias     *aliasTable // nil until the pod first needs aliasing
	// aliasOwner counts alias tables against Limits.MaxAliasTables.
	aliasOwner *limitState
	overShare  bool            // logged that the pod reached its PodShare
	ranks      []kvindex.PodID // scratch: the pod's DP ranks, for its share
	keys       []blockkeys.Key // scratch for Add/Remove
	held       []bool          // scratch for AddHeld's answer
	removing   []blockkeys.Key // keys of the current run of BlockRemoved events (removed.go)
	// answered: the keys the current batch stored or removed, as indexed
	// (Config.Answered); reset per batch.
	answered  []blockkeys.Key
	buf       []byte // scratch for serialisation
	hintFinal bool   // the parity hint names a definite cause
	// everMatched: some block of this pod matched, so a mismatch means unseen
	// extra keys, not a configuration difference.
	everMatched bool
	loggedHint  string
	parity      paritySampler // full checking or sampling (parity_sampling.go)

	// groups is what the pod said of its KV-cache groups (index = group_idx,
	// at most maxGroups); fullBit numbers its full-attention groups for the
	// group mask (0 = not full or not seen).
	groups  []event.GroupKind
	named   []bool
	fullBit []uint8
	nFull   int
	// copies counts physical copies (nil once the pod sends
	// remaining_copy_counts, or for engines that never duplicate); masks
	// tracks which full-attention groups hold a block (nil unless nFull > 1).
	copies          *countTable
	copiesAuthority bool
	masks           *countTable

	// applyMu serialises Apply and ForgetPod on one pod: it guards the
	// fields above mu. kvevents already applies a pod's batches one at a
	// time, so the lock is uncontended.
	applyMu sync.Mutex

	mu    sync.Mutex
	stats PodStats
}

// New returns an Applier. Index, Interner and Hashers are required;
// a limit that cannot be enforced (PodShare without Share) is an error.
func New(cfg Config) (*Applier, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// A negative size reads as unset, as it always has (ValidateConfig
	// refuses it).
	cfg.DigestCacheSize = max(cfg.DigestCacheSize, 0)
	cfg.Limits.MaxDigestCaches, cfg.Limits.MaxAliasTables = max(cfg.Limits.MaxDigestCaches, 0), max(cfg.Limits.MaxAliasTables, 0)
	cfg = cfg.withDefaults() // options.go
	a := &Applier{
		idx: cfg.Index, in: cfg.Interner, hashers: cfg.Hashers, m: cfg.Metrics, log: cfg.Logger,
		dcSize: cfg.DigestCacheSize, aliasCap: cfg.AliasCacheSize, copyCap: cfg.CopyTableSize, maskCap: cfg.GroupMaskTableSize,
		pods: map[podKey]*podState{}, digests: map[kvindex.ModelID]*digestCache{}, alt: map[blockkeys.KeyConfig]*blockkeys.Hasher{},
		answered: cfg.Answered, heldAdder: cfg.Held,
	}
	a.tables.limit, a.tables.gauge = cfg.HoldTableBytes, cfg.Metrics.holdTableBytes
	if err := a.initLimits(cfg.Limits, cfg.Share); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Applier) pod(b *event.Batch) *podState {
	k := podKey{b.Pod, b.DPRank}
	a.mu.RLock()
	state := a.pods[k]
	a.mu.RUnlock()
	if state != nil {
		return state
	}
	id := a.in.Pod(b.Pod, b.DPRank)
	a.mu.Lock()
	defer a.mu.Unlock()
	if state = a.pods[k]; state == nil {
		state = &podState{id: id, name: b.Pod, rank: b.DPRank}
		state.stats.Pod, state.stats.DPRank = b.Pod, b.DPRank
		a.pods[k] = state
	}
	return state
}

// bindModel caches the model's id, the engine's hasher and the digest cache
// on the pod.
func (a *Applier) bindModel(pod *podState, model string, engine blockkeys.Engine) {
	if pod.hasher != nil && pod.modelName == model && pod.hasher.Engine() == engine {
		return
	}
	id := a.in.Model(model)
	dc := a.digestCacheFor(pod, id)
	if pod.hasher != nil { // the pod now serves another model or engine: start parity afresh
		pod.resetParity()
	}
	pod.modelName, pod.modelID, pod.hasher, pod.digests = model, id, a.hashers.ForEngine(model, engine), dc
	if engine.Valid() {
		a.engines.Or(1 << engine)
	}
	a.podEngines.set(pod.id, engine)
}

// Engines is the set of engines whose batches were applied, bit e for
// Engine e: the request path computes keys only for those engines.
func (a *Applier) Engines() uint32 { return a.engines.Load() }

// resetParity forgets what the pod's parity check concluded. Called when the
// pod's cache is wiped (AllBlocksCleared: often an engine restart, maybe with
// a new seed) or it changes model, so a stale hint does not outlive its cause.
func (pod *podState) resetParity() {
	pod.hintFinal, pod.everMatched = false, false
	pod.dropAlias()
	pod.parity.reset()
	pod.mu.Lock()
	pod.stats.ParityHint = ""
	pod.mu.Unlock()
}

// resetHolding forgets the copy counts and group masks: after a clear the
// pod holds nothing. What it said of its groups stays (same engine config).
func (pod *podState) resetHolding() {
	pod.copies.release()
	pod.masks.release()
	pod.copies, pod.masks = nil, nil
}

// Apply implements BatchSink. Its outcome says whether the pod is left
// untrusted (ApplyOutcome.IndexFailed); whether the pod may be served is
// decided by the one who records it (kvevents), not here.
func (a *Applier) Apply(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	start := time.Now()
	pod := a.pod(b)
	pod.applyMu.Lock()
	defer pod.applyMu.Unlock()
	a.bindModel(pod, b.Model, b.Engine)
	var d batchDelta
	pod.answered = pod.answered[:0]
	wasUntrusted := pod.untrusted
	if pod.untrusted {
		if err := a.idx.ClearPod(ctx, pod.id); err != nil {
			d.indexErrors++
			a.log.Debug("index still failing; dropping batch of untrusted pod", "pod", pod.name, "dp_rank", pod.rank, "err", err)
			a.finish(pod, b, &d, start, wasUntrusted)
			return event.ApplyOutcome{IndexFailed: true}
		}
		pod.untrusted = false
		pod.resetHolding()
		pod.parity.reset()
		d.recoveries++
		a.log.Info("pod cleared after index error; trusted again, rebuilding from new events", "pod", pod.name, "dp_rank", pod.rank)
	}
	// A run of BlockRemoved events on one medium is removed from the index
	// in one call when the run ends (removed.go); its events count as
	// applied then.
	removing, removingTier := 0, event.Tier(0)
	for i := 0; i <= len(b.Events); i++ {
		if removing > 0 && (i == len(b.Events) || b.Events[i].Kind != event.BlockRemoved || b.Events[i].Medium != removingTier) {
			if err := a.flushRemoved(ctx, pod, removingTier, &d); err != nil {
				a.indexError(pod, b, i-1, err, &d)
				break
			}
			d.events[event.BlockRemoved] += uint64(removing)
			removing = 0
		}
		if i == len(b.Events) {
			break
		}
		ev := &b.Events[i]
		var err error
		switch ev.Kind {
		case event.BlockStored:
			err = a.stored(ctx, pod, b.Engine, ev, &d)
		case event.BlockRemoved:
			a.removed(pod, b.Engine, ev, &d)
			removing, removingTier = removing+1, ev.Medium
			continue
		case event.AllBlocksCleared:
			if err = a.idx.ClearPod(ctx, pod.id); err == nil {
				a.sessions.forget(pod.id)
				d.hint = ""
				pod.resetParity()
				pod.resetHolding()
			}
		case event.BlockSnapshot:
			if err = a.snapshot(ctx, pod, ev, &d); err == nil && ev.SnapshotPart {
				continue // one snapshot however many parts: counted with its first
			}
		default:
			continue // decoders do not produce other kinds; nothing to apply
		}
		if err != nil {
			a.indexError(pod, b, i, err, &d)
			break
		}
		d.events[ev.Kind]++
	}
	pod.removing = pod.removing[:0]
	a.tellAnswered(ctx, pod, b)
	a.finish(pod, b, &d, start, wasUntrusted)
	return event.ApplyOutcome{IndexFailed: pod.untrusted}
}

// maxKeptAnswered bounds the answered buffer a pod keeps between batches.
const maxKeptAnswered = 1 << 16

// tellAnswered hands the batch's answered keys to Config.Answered.
func (a *Applier) tellAnswered(ctx context.Context, pod *podState, b *event.Batch) {
	if a.answered != nil && len(pod.answered) > 0 {
		a.answered(ctx, b, pod.answered)
	}
	pod.answered = pod.answered[:0]
	if cap(pod.answered) > maxKeptAnswered {
		pod.answered = nil
	}
}

// indexError marks the pod untrusted after the index failed on event i:
// the rest of the batch is dropped, the pod cleared on its next batch.
func (a *Applier) indexError(pod *podState, b *event.Batch, i int, err error, d *batchDelta) {
	d.indexErrors++
	pod.untrusted = true
	a.log.Warn("index error: pod marked untrusted, rest of batch dropped; it is cleared and rebuilt on its next batch",
		"pod", pod.name, "dp_rank", pod.rank, "event", b.Events[i].Kind.String(), "dropped_events", len(b.Events)-i-1, "err", err)
}
