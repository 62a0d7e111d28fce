package indexer

import (
	"slices"
	"sort"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// Shared storage is a tier, not a pod.
//
// llm-d's filesystem offload connector (llm-d-kv-cache
// kv_connectors/llmd_fs_backend/llmd_fs_backend/event_publisher.py)
// publishes the blocks it writes to shared storage on the topic
// kv@SHARED_STORAGE@<model> (or kv@OBJECT_STORE@<model>), so the medium
// lands in the topic's pod slot and its blocks are indexed under a pod
// named SHARED_STORAGE that no router can pick. The index keeps them there,
// one holder per block whatever the number of readers; at query time the
// storage's run of consecutive blocks from block 0 is credited to every
// reader as TierShared: a reader whose own run is shorter is extended to
// the storage's run, the extra blocks counted on the shared tier. Storage
// sources never appear in a score or a pick.

// Who may speak for shared storage. A storage source's blocks are credited
// to many pods at once, so a claim is worth more than any one pod's events;
// the topic's pod slot is whatever the publisher wrote. Hence no source is
// trusted by default: DefaultStorageReaders is empty, and a batch whose
// topic names one of StorageMedia that --storage-readers does not configure
// is refused (dropped, counted in kvindexd_storage_claims_refused_total,
// logged at most once per storageLogEvery), never indexed as a pod either.
// An operator who runs llm-d's connector opts in with
// --storage-readers SHARED_STORAGE=* (docs/security.md says who can then
// publish under that name).

// StorageMedia are the pod-slot names llm-d's connector publishes storage
// blocks under; they are refused unless configured as sources.
var StorageMedia = []string{"OBJECT_STORE", "SHARED_STORAGE"}

// storageLogEvery spaces the refused-claim log lines.
const storageLogEvery = 10 * time.Second

// DefaultStorageReaders are the storage sources known without
// configuration: none (see above).
func DefaultStorageReaders() map[string][]string {
	return map[string][]string{}
}

// refuseStorageClaim reports whether b claims to speak for a storage medium
// no configured source names; such a batch is counted, logged (rate
// limited) and not applied.
func (ix *Indexer) refuseStorageClaim(b *event.Batch) bool {
	if !slices.Contains(StorageMedia, b.Pod) || ix.IsStorage(b.Pod) {
		return false
	}
	ix.m.storageRefused.Inc()
	now := time.Now().UnixNano()
	if last := ix.storageLogAt.Load(); now-last >= int64(storageLogEvery) && ix.storageLogAt.CompareAndSwap(last, now) {
		ix.log.Warn("storage claim refused: the topic names a storage medium --storage-readers does not configure",
			"pod", b.Pod, "model", b.Model[:min(len(b.Model), 128)])
	}
	return true
}

// storageSources is Config.StorageReaders, fixed at New.
type storageSources struct {
	names   []string   // sorted source (pod) names
	readers [][]string // per name; nil = every pod of the model
}

func newStorageSources(m map[string][]string) storageSources {
	if m == nil {
		m = DefaultStorageReaders()
	}
	var s storageSources
	for name := range m {
		s.names = append(s.names, name)
	}
	sort.Strings(s.names)
	for _, name := range s.names {
		s.readers = append(s.readers, m[name])
	}
	return s
}

// IsStorage reports whether name is a storage source (Config.StorageReaders):
// a publisher of storage blocks, never a candidate pod.
func (ix *Indexer) IsStorage(name string) bool {
	_, ok := slices.BinarySearch(ix.storage.names, name)
	return ok
}

// storageScratch is the per-request state of crediting storage (kept in
// engineKeys, which every Result and PickResult owns).
type storageScratch struct {
	ids   []kvindex.PodID // every DP rank of every storage source
	src   []int           // ids[i]'s index in storageSources.names
	cands []kvindex.PodID // the caller's candidates plus ids
	found []kvindex.PodScore
	rd    []kvindex.PodID
}

// storageIDs resolves the storage sources this process has interned.
func (ix *Indexer) storageIDs(sc *storageScratch) {
	sc.ids, sc.src = sc.ids[:0], sc.src[:0]
	for i, name := range ix.storage.names {
		n := len(sc.ids)
		sc.ids = ix.in.AppendPodsNamed(sc.ids, name)
		for range sc.ids[n:] {
			sc.src = append(sc.src, i)
		}
	}
}

// withStorage returns cands plus the storage sources, so that a candidate
// filter does not hide the blocks its readers can load. nil stays nil.
func withStorage(cands []kvindex.PodID, sc *storageScratch) []kvindex.PodID {
	if cands == nil || len(sc.ids) == 0 {
		return cands
	}
	sc.cands = append(append(sc.cands[:0], cands...), sc.ids...)
	return sc.cands
}

// creditStorage takes the storage sources out of res and credits their runs
// to their readers (among cands, nil = any) as TierShared, then re-sorts.
func (ix *Indexer) creditStorage(model kvindex.ModelID, cands []kvindex.PodID, sc *storageScratch, res *kvindex.ScoreResult) {
	if len(sc.ids) == 0 {
		return
	}
	sc.found = sc.found[:0]
	kept := res.Pods[:0]
	for _, ps := range res.Pods {
		if slices.Contains(sc.ids, ps.Pod) {
			if ix.trusted(ps.Pod) {
				sc.found = append(sc.found, ps)
			}
			continue
		}
		kept = append(kept, ps)
	}
	res.Pods = kept
	if len(sc.found) == 0 {
		return
	}
	w := ix.scorer.Weights()[event.TierShared]
	var modelName string
	var all []applier.PodStats // every applied pod, read once when some source has implicit readers
	for _, s := range sc.found {
		src := sc.src[slices.Index(sc.ids, s.Pod)]
		m := s.MatchedBlocks
		sc.rd = sc.rd[:0]
		if names := ix.storage.readers[src]; names != nil {
			for _, n := range names {
				sc.rd = ix.in.AppendPodsNamed(sc.rd, n)
			}
		} else {
			if all == nil {
				all = ix.applier.PodStats()
				modelName = ix.in.ModelName(model)
			}
			for _, st := range all {
				if st.Model != modelName || ix.IsStorage(st.Pod) {
					continue
				}
				if id, ok := ix.in.LookupPod(st.Pod, st.DPRank); ok {
					sc.rd = append(sc.rd, id)
				}
			}
		}
		for _, r := range sc.rd {
			if (cands != nil && !slices.Contains(cands, r)) || slices.Contains(sc.ids, r) {
				continue
			}
			i := slices.IndexFunc(res.Pods, func(p kvindex.PodScore) bool { return p.Pod == r })
			if i < 0 {
				res.Pods = append(res.Pods, kvindex.PodScore{Pod: r})
				i = len(res.Pods) - 1
			}
			p := &res.Pods[i]
			// per-tier runs: the reader can load the source's whole run
			// from block 0, whatever it holds itself
			p.TierRuns[event.TierShared] = max(p.TierRuns[event.TierShared], int32(m))
			if extra := m - p.MatchedBlocks; extra > 0 {
				p.TierBlocks[event.TierShared] += int32(extra)
				p.Score += float64(extra) * w
				p.MatchedBlocks = m
			}
		}
	}
	slices.SortFunc(res.Pods, kvindex.ComparePodScores)
}

// The rule that keeps a storage credit below a pod's own blocks. Pick's
// policies read two numbers per candidate: Matched, the blocks the pod
// holds (its load guards and prefix thresholds compare these), and Cached,
// the tier-weighted blocks (the cost and score policies). A block credited
// from shared storage enters Cached at the shared tier weight only, which
// kvindex.TierWeights.Validate keeps at or below the gpu, cpu and disk
// weights, and is never part of Matched. So, of two pods whose runs come
// from the same prefix, one holding k >= 1 blocks itself (on gpu, cpu or
// disk) and one whose j <= k blocks come only from storage, the first has
// the larger Matched (k against 0) and an equal-or-larger Cached
// (k*own weight >= j*shared weight), so no policy prefers the second for
// its cache; load may still decide.
// Score answers keep reporting the credited run in matched_blocks, with
// the credit in tiers.shared.

// routeMatched is the Matched a policy sees: the candidate's run without
// the blocks credited from shared storage.
func routeMatched(matched int, shared int32) int {
	return max(matched-int(shared), 0)
}
