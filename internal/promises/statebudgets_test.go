package promises

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Issue 35 (state budgets): what hostile publishers can make the daemon hold
// or claim, on the shipped binary at its defaults.

// One batch with seq 2^64-1 after seq 0 is a gap, counted once; what it adds to
// kvindexd_kvevents_missed_batches_total is bounded (2^24 per jump), not 1.8e19.
func TestPromiseMissedBatchesBoundedPerJump(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(3, 1)
	publish(t, pub, "pod-jump", model, 0, stored(engineHashes(t, toks), toks))
	more := prompt(4, 1)
	publish(t, pub, "pod-jump", model, 1<<64-1, stored(engineHashes(t, more), more))
	wait.Until(t, "the gap", func() string {
		if v := d.Metric("kvindexd_kvevents_seq_gaps_total"); v != 1 {
			return fmt.Sprintf("seq_gaps_total %v", v)
		}
		return ""
	})
	if v := d.Metric("kvindexd_kvevents_missed_batches_total"); v != 1<<24 {
		t.Errorf("missed_batches_total = %v after one jump to 2^64-1, want the bound 2^24", v)
	}
}

// Issue 35: the pod share is a pod's across its DP ranks (one pod on 5 ranks held
// 8.1M of the 8.39M index), and when the index evicts a pod's blocks for capacity
// that pod's answers say so (complete:false, "evicted_for_capacity"), whichever
// pod's batch made the room. --capacity 65536 (share 16,384 at the default
// --pod-share 4): four honest pods of 8,000 blocks, one pod flooding 16,384 blocks
// on each of 5 ranks, then two more flooders at their share: 81,152 blocks for
// 65,536 entries.
func TestPromiseShareAcrossRanksAndEvictionsSaid(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--capacity", "65536")
	pub := d.Publisher()
	stored := map[string]int64{} // "pod/rank" -> blocks published
	send := func(pod string, rank int, seed uint64, n int) {
		b := &event.Batch{DPRank: rank, Events: []event.Event{{Kind: event.BlockStored, BlockHashes: randomHashes(seed, n)}}}
		publish(t, pub, pod, model, 0, b)
		stored[fmt.Sprintf("%s/%d", pod, rank)] = int64(n)
	}
	for i := range 4 {
		send(fmt.Sprintf("pod-honest-%d", i), 0, uint64(100+i), 8000)
	}
	for rank := range 5 {
		send("pod-ranks", rank, uint64(200+rank), 16384)
	}
	send("pod-flood-a", 0, 300, 16384)
	send("pod-flood-b", 0, 301, 16384)
	var pods []harness.PodInfo
	wait.Until(t, "every batch applied", func() string {
		pods = d.Pods()
		n := 0
		for _, p := range pods {
			if p.EventsApplied > 0 {
				n++
			}
		}
		if n != len(stored) {
			return fmt.Sprintf("%d of %d streams applied", n, len(stored))
		}
		return ""
	})
	var ranksHeld int64
	evicted := 0
	for _, p := range pods {
		if p.Pod == "pod-ranks" {
			ranksHeld += p.Blocks
		}
		want := stored[fmt.Sprintf("%s/%d", p.Pod, p.DPRank)]
		if p.Pod == "pod-ranks" {
			continue // trimmed to its share, not evicted: checked below
		}
		if p.Blocks < want {
			evicted++
			if p.Complete || p.Reason != "evicted_for_capacity" {
				t.Errorf("%s/%d holds %d of its %d blocks and says complete=%v reason=%q, want evicted_for_capacity",
					p.Pod, p.DPRank, p.Blocks, want, p.Complete, p.Reason)
			}
		}
	}
	if ranksHeld > 16384 {
		t.Errorf("pod-ranks holds %d blocks over its 5 ranks, its share is 16384", ranksHeld)
	}
	if evicted == 0 || d.Metric("kvindexd_capacity_evicted_pods_total") == 0 {
		t.Errorf("81,152 blocks in 65,536 entries: %d pods evicted, capacity_evicted_pods_total %v",
			evicted, d.Metric("kvindexd_capacity_evicted_pods_total"))
	}
	t.Logf("pod-ranks holds %d; %d pods evicted; evictions %v", ranksHeld, evicted, d.Metric("kvindexd_index_evictions_total"))
}
