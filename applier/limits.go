package applier

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Limits.
const (
	// DefaultMaxDigestCaches bounds the models with a parity digest cache
	// (~11 MB each at DefaultDigestCacheSize): ~180 MB.
	DefaultMaxDigestCaches = 16
	// DefaultMaxAliasTables bounds the pods with an alias table (~4.7 MB each
	// at DefaultAliasCacheSize): ~300 MB.
	DefaultMaxAliasTables = 64
	// DefaultPodShare is what the daemon configures: one pod holds at most a
	// quarter of the in-memory index. The applier's own default is none.
	DefaultPodShare = 4
)

// Limits bound the state publishers can make the applier hold. Beyond
// a limit nothing fails: the block goes unverified, unaliased or unindexed,
// and a counter says so.
type Limits struct {
	// MaxDigestCaches bounds the models with a digest cache (0 = default).
	// A further model's blocks are still indexed; their parity goes
	// unverified beyond each event's first block. A model's cache is freed
	// when its last pod is forgotten (ForgetPod) or moves to another model.
	MaxDigestCaches int
	// MaxAliasTables bounds the pods with an alias table (0 = default). A
	// further mismatching vLLM pod is indexed under the engine's hashes (the
	// router will not match it, but removals stay exact); a further SGLang
	// pod's blocks are not indexed. A table is freed when its pod is
	// cleared, changes model or is forgotten.
	MaxAliasTables int
	// PodShare, with the ShareAccounting of the index (Config.Share;
	// the in-memory index has it), caps every pod at Capacity/PodShare entries so
	// that one pod, however much it publishes, never evicts the others:
	// blocks of a BlockStored beyond the share are not indexed (the first
	// ones of the event are kept: a prefix is what routing matches). 0 =
	// no per-pod bound; > 0 without Config.Share is an error.
	PodShare int
	// PodShare applies to a pod name across its DP ranks, and to the
	// records of an engine snapshot as to BlockStored.
	//
	// SessionsPerPod bounds the sessions remembered per pod from
	// BlockStored.session_id (sessions.go); 0 = DefaultSessionsPerPod,
	// < 0 = sessions are not remembered.
	SessionsPerPod int
	// MaxSessions bounds the sessions remembered by all pods together
	// (sessions.go); 0 = DefaultMaxSessions.
	MaxSessions int
}

// ShareAccounting is what Limits.PodShare needs from the index: its
// capacity and each pod's entries. The in-memory index has it; Redis does
// not (its memory is bounded by the server's maxmemory).
type ShareAccounting interface {
	Capacity() int64
	PodEntries(pod kvindex.PodID) int64
	// PodsEntries is what the pods hold together: the share is per pod
	// name, across its DP ranks.
	PodsEntries(pods []kvindex.PodID) int64
}

// ErrNoShareAccounting is New's answer to a PodShare without the
// ShareAccounting to enforce it: a bound that was asked for is never
// switched off without a word.
var ErrNoShareAccounting = errors.New("kvindex: a pod share needs an index that accounts entries per pod (the in-memory index)")

// limitState is the applier's accounting for Limits.
type limitState struct {
	maxDigest, maxAlias int
	share               int64 // entries per pod; 0 = unbounded
	// shareLocks make the share's check and the index write one step per
	// pod name: a pod's DP ranks are applied by different workers, and
	// each reading what the others held before any wrote let a pod on 5
	// ranks exceed its share. Striped by pod name (no map to bound); a
	// stripe is held for one event's check and write.
	shareLocks  [64]sync.Mutex
	shareSeed   maphash.Seed
	shareIdx    ShareAccounting
	dcRefs      map[kvindex.ModelID]int // pods bound to each digest cache; under Applier.mu
	aliasTables atomic.Int64
	m           limitMetrics
}

type limitMetrics struct {
	digestCaches, aliasTables                        prometheus.Gauge
	digestRefused, aliasRefused, shareRefused, freed prometheus.Counter
}

func newLimitMetrics(ns string) (limitMetrics, []prometheus.Collector) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
	}
	m := limitMetrics{
		digestCaches:  g("digest_caches", "Models with a parity digest cache (bounded by --max-digest-caches)."),
		aliasTables:   g("alias_tables", "Pods with an alias table (bounded by --max-alias-tables)."),
		digestRefused: c("digest_cache_refused_total", "Pods bound to a model that got no digest cache: --max-digest-caches reached (parity goes unverified)."),
		aliasRefused:  c("alias_refused_blocks_total", "Blocks that needed an alias table but got none: --max-alias-tables reached (indexed under the engine hash, or not at all for SGLang)."),
		shareRefused:  c("pod_share_refused_blocks_total", "Stored blocks not indexed because their pod holds its share of the index (--pod-share)."),
		freed:         c("pods_forgotten_total", "Pods whose applier state was dropped after they went silent (--pod-expiry)."),
	}
	return m, []prometheus.Collector{m.digestCaches, m.aliasTables, m.digestRefused, m.aliasRefused, m.shareRefused, m.freed}
}

func (a *Applier) initLimits(l Limits, share ShareAccounting) error {
	// l comes resolved (Config.withDefaults).
	a.lim.maxDigest, a.lim.maxAlias, a.lim.dcRefs, a.lim.m = l.MaxDigestCaches, l.MaxAliasTables, map[kvindex.ModelID]int{}, a.m.limits
	if l.SessionsPerPod > 0 {
		a.sessions.limit, a.sessions.global = l.SessionsPerPod, l.MaxSessions
	}
	a.sessions.pods, a.sessions.m = map[kvindex.PodID]*podSessions{}, a.m.sessions
	if err := Options.PodShare.Check(int64(l.PodShare)); err != nil {
		return fmt.Errorf("applier: %w", err)
	}
	if l.PodShare > 0 {
		if share == nil {
			return ErrNoShareAccounting
		}
		a.lim.shareIdx, a.lim.share = share, max(share.Capacity()/int64(l.PodShare), 1)
		a.lim.shareSeed = maphash.MakeSeed()
	}
	return nil
}

// digestCacheFor binds pod to model id's digest cache, creating it if the
// limit allows (nil otherwise: parity unverified), and releases the cache of
// the model pod was bound to.
func (a *Applier) digestCacheFor(pod *podState, id kvindex.ModelID) *digestCache {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pod.digests != nil { // the pod holds its current model's cache
		a.releaseDigestLocked(pod.modelID)
	}
	dc := a.digests[id]
	if dc == nil {
		if len(a.digests) >= a.lim.maxDigest {
			a.lim.m.digestRefused.Inc()
			return nil
		}
		dc = newDigestCache(a.dcSize)
		a.digests[id] = dc
		a.lim.m.digestCaches.Set(float64(len(a.digests)))
	}
	a.lim.dcRefs[id]++
	return dc
}

// releaseDigestLocked drops one pod's hold on model id's cache; a.mu is held.
func (a *Applier) releaseDigestLocked(id kvindex.ModelID) {
	if a.lim.dcRefs[id]--; a.lim.dcRefs[id] <= 0 {
		delete(a.lim.dcRefs, id)
		delete(a.digests, id)
		a.lim.m.digestCaches.Set(float64(len(a.digests)))
	}
}

// aliasPut records engine hash eh -> our key k for pod. false: pod has no
// table and the limit refuses one.
func (a *Applier) aliasPut(pod *podState, eh uint64, k blockkeys.Key) bool {
	if pod.alias == nil {
		if a.lim.aliasTables.Add(1) > int64(a.lim.maxAlias) {
			a.lim.aliasTables.Add(-1)
			a.lim.m.aliasRefused.Inc()
			return false
		}
		a.lim.m.aliasTables.Inc()
		pod.alias, pod.aliasOwner = newAliasTable(a.aliasCap), &a.lim
	}
	pod.alias.put(eh, k)
	return true
}

// dropAlias frees pod's alias table and its slot under MaxAliasTables.
func (pod *podState) dropAlias() {
	if pod.alias == nil {
		return
	}
	pod.alias = nil
	pod.aliasOwner.aliasTables.Add(-1)
	pod.aliasOwner.m.aliasTables.Dec()
}

// lockShare locks pod's share stripe while the caller checks the share and
// writes the index, and returns it for unlockShare (nil without a share).
func (a *Applier) lockShare(pod *podState) *sync.Mutex {
	if a.lim.share == 0 {
		return nil
	}
	mu := &a.lim.shareLocks[maphash.String(a.lim.shareSeed, pod.name)%uint64(len(a.lim.shareLocks))]
	mu.Lock()
	return mu
}

func unlockShare(mu *sync.Mutex) {
	if mu != nil {
		mu.Unlock()
	}
}

// trimToShare returns the prefix of keys that pod may still add under
// PodShare, counting what it refuses.
func (a *Applier) trimToShare(pod *podState, keys []blockkeys.Key) []blockkeys.Key {
	return keys[:a.shareAllows(pod, len(keys))]
}

// shareAllows is how many of n further entries pod may add under PodShare
// (the first ones: a prefix is what routing matches), counting and logging
// what it refuses. The share is the pod's, not its DP rank's: what every
// rank of the pod name holds counts, so a pod publishing on 64 ranks holds
// no more than one on a single rank (before, one pod on 5 ranks held 8.1M
// of an 8.39M index).
func (a *Applier) shareAllows(pod *podState, n int) int {
	if a.lim.share == 0 || n == 0 {
		return n
	}
	pod.ranks = a.in.AppendPodsNamed(pod.ranks[:0], pod.name)
	room := a.lim.share - a.lim.shareIdx.PodsEntries(pod.ranks)
	if int64(n) <= room {
		return n
	}
	room = max(room, 0)
	a.lim.m.shareRefused.Add(float64(int64(n) - room))
	if !pod.overShare {
		pod.overShare = true
		a.log.Warn("pod holds its share of the index; further blocks are not indexed until it removes some",
			"pod", pod.name, "dp_rank", pod.rank, "share_entries", a.lim.share)
	}
	return int(room)
}

// ForgetPod clears pod from the index and drops everything the applier holds
// for it: its stats, alias table and digest-cache hold. A pod that publishes
// again starts afresh. If the clear fails the pod stays, untrusted, and is
// cleared before its next batch.
func (a *Applier) ForgetPod(ctx context.Context, pod string, dpRank int) {
	k := podKey{pod, dpRank}
	a.mu.RLock()
	state := a.pods[k]
	a.mu.RUnlock()
	if state == nil {
		return
	}
	state.applyMu.Lock()
	defer state.applyMu.Unlock()
	if err := a.idx.ClearPod(ctx, state.id); err != nil {
		if !state.untrusted {
			state.untrusted = true
			a.setUntrusted(state, true)
		}
		a.log.Warn("index error while forgetting a silent pod: marked untrusted, cleared when the index is back",
			"pod", pod, "dp_rank", dpRank, "err", err)
		return
	}
	a.sessions.forget(state.id)
	a.mu.Lock()
	if a.pods[k] == state {
		delete(a.pods, k)
	}
	if state.digests != nil {
		a.releaseDigestLocked(state.modelID)
		state.digests = nil
	}
	a.mu.Unlock()
	state.dropAlias()
	state.resetHolding()
	state.keys, state.buf = nil, nil
	if state.untrusted {
		state.untrusted = false
		a.setUntrusted(state, false)
	}
	a.lim.m.freed.Inc()
	a.log.Info("silent pod forgotten: cleared from the index", "pod", pod, "dp_rank", dpRank,
		"last_event", state.snapshotLastEvent())
}

func (pod *podState) snapshotLastEvent() time.Time {
	pod.mu.Lock()
	defer pod.mu.Unlock()
	return pod.stats.LastEvent
}
