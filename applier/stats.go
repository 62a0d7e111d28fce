package applier

// What the applier counts: per-batch deltas, flushed at once into the pod's
// PodStats and the metrics.

import (
	"sort"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// PodStats is one (pod, DP rank)'s view from the applier.
type PodStats struct {
	Pod                                        string
	DPRank                                     int
	Model                                      string
	Engine                                     blockkeys.Engine
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

// batchDelta counts one batch, added to the pod's stats and the metrics at once.
type batchDelta struct {
	events                          [event.BlockSnapshot + 1]uint64
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
	// unverifiedBigram: token pairs (SGLang with EAGLE) that do not chain
	// ([t_i, t_i+1] whose t_i+1 is not the next pair's t_i) or from an
	// engine that does not hash pairs.
	unverifiedBigram
	numUnverifiedReasons
)

var unverifiedNames = [numUnverifiedReasons]string{"", "no_tokens", "token_count", "partial_block", "block_size",
	"parent_unknown", "extra_keys", "lora_name_missing", "bigram"}

func (d *batchDelta) unverify(r unverifiedReason, n uint64) {
	d.unverified += n
	d.unverifiedBy[r] += n
	d.lastUnverified = r
}

func (a *Applier) finish(pod *podState, b *event.Batch, d *batchDelta, start time.Time, wasUntrusted bool) {
	var n uint64
	for _, c := range d.events {
		n += c
	}
	pod.mu.Lock()
	st := &pod.stats
	st.Model, st.Engine = b.Model, b.Engine
	st.EventsApplied += n
	st.BlocksStored += d.stored
	st.BlocksRemoved += d.removed
	st.Clears += d.events[event.AllBlocksCleared]
	st.Snapshots += d.events[event.BlockSnapshot]
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
	st.FullAttentionGroups = pod.nFull
	st.ParitySampledOut += d.sampledOut
	if d.hint != "" {
		st.ParityHint = d.hint
	}
	st.IndexErrors += d.indexErrors
	st.Untrusted = pod.untrusted
	pod.mu.Unlock()
	if pod.untrusted != wasUntrusted {
		a.setUntrusted(pod, pod.untrusted)
	}
	if d.hint != "" && d.hint != pod.loggedHint {
		pod.loggedHint = d.hint
		a.log.Warn("block hash parity mismatch: indexing this pod under kvindex's own keys",
			"pod", pod.name, "dp_rank", pod.rank, "model", b.Model, "hint", d.hint)
	}
	a.m.flush(d, time.Since(start))
}

// PodStats returns every (pod, DP rank) seen, sorted by pod then rank.
func (a *Applier) PodStats() []PodStats {
	a.mu.RLock()
	out := make([]PodStats, 0, len(a.pods))
	for _, pod := range a.pods {
		pod.mu.Lock()
		out = append(out, pod.stats)
		pod.mu.Unlock()
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
