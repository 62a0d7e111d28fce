package promises

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvindex"
)

// One pod never evicts the others (--pod-share, default 4): with
// `--capacity 200000` and every other flag at its default, six pods store
// 40-240 blocks each with token ids, then one pod publishes 360,000
// hash-only blocks. The six still score their whole prefixes, the hog is
// held at capacity/4 (the rest refused and counted) and nothing is evicted.
func TestPromisePodShare(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--capacity", "200000")
	pub := d.publisher()
	prompts := map[string][]uint32{}
	for i := 0; i < 6; i++ {
		pod := fmt.Sprintf("pod-%d", i)
		prompts[pod] = prompt(i+1, 40*(i+1))
		publish(t, pub, pod, model, 0, stored(engineHashes(t, prompts[pod]), prompts[pod]))
	}
	fleetWarm := func() string {
		for pod, toks := range prompts {
			if got := d.scoreTokens(model, toks)[pod]; got != len(toks)/blockSize {
				return fmt.Sprintf("%s scores %d of %d blocks", pod, got, len(toks)/blockSize)
			}
		}
		return ""
	}
	eventually(t, waitLimit, "the fleet before the hog", fleetWarm)

	const hogBlocks, perBatch = 360_000, 10_000
	rng := rand.New(rand.NewPCG(1, 2))
	for seq := 0; seq < hogBlocks/perBatch; seq++ {
		hashes := make([]uint64, perBatch)
		for i := range hashes {
			hashes[i] = rng.Uint64()
		}
		b := &kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.BlockStored, BlockHashes: hashes, BlockSize: blockSize}}}
		publish(t, pub, "hog", model, uint64(seq), b)
	}
	eventually(t, 2*waitLimit, "the hog's batches applied", func() string {
		p, _ := d.pod("hog")
		if p.EventsApplied != hogBlocks/perBatch {
			return fmt.Sprintf("hog: %d events applied", p.EventsApplied)
		}
		return ""
	})
	if msg := fleetWarm(); msg != "" {
		t.Errorf("after the hog: %s", msg)
	}
	if p, _ := d.pod("hog"); p.Blocks > 200_000/4 {
		t.Errorf("the hog holds %d entries, over its share of %d", p.Blocks, 200_000/4)
	}
	if v := d.metric("kvindexd_pod_share_refused_blocks_total"); v < hogBlocks-200_000/4 {
		t.Errorf("kvindexd_pod_share_refused_blocks_total = %v, want >= %d", v, hogBlocks-200_000/4)
	}
	if v := d.metric("kvindexd_index_evictions_total"); v != 0 {
		t.Errorf("kvindexd_index_evictions_total = %v, want 0", v)
	}
}

// Silent pods are forgotten (--pod-expiry): a pod that stores 16 blocks and
// goes quiet leaves the scores after the expiry, and the applier drops its
// state (kvindexd_pods_forgotten_total), not only the subscriber.
func TestPromisePodExpiry(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--pod-expiry", "2s")
	pub := d.publisher()
	toks := prompt(1, 16)
	publish(t, pub, "quiet", model, 0, stored(engineHashes(t, toks), toks))
	eventually(t, waitLimit, "stored", func() string {
		if got := d.scoreTokens(model, toks)["quiet"]; got != 16 {
			return fmt.Sprintf("quiet scores %d", got)
		}
		return ""
	})
	start := time.Now()
	eventually(t, waitLimit, "expired", func() string {
		if s := d.scoreTokens(model, toks); len(s) != 0 {
			return fmt.Sprintf("still scored: %v", s)
		}
		return ""
	})
	if el := time.Since(start); el < time.Second {
		t.Errorf("the pod left the scores %v after its last batch, before the 2 s expiry", el)
	}
	eventually(t, 5*time.Second, "expiry metrics", func() string {
		exp := d.metric("kvindexd_kvevents_streams_expired_total")
		clr := d.metric(`kvindexd_kvevents_synthetic_clears_total{reason="expired"}`)
		fgt := d.metric("kvindexd_pods_forgotten_total")
		if exp != 1 || clr != 1 || fgt != 1 {
			return fmt.Sprintf("streams_expired_total %v, synthetic_clears_total{expired} %v, pods_forgotten_total %v; want 1 each", exp, clr, fgt)
		}
		return ""
	})
	if _, ok := d.pod("quiet"); ok {
		t.Errorf("/v1/pods still lists the expired pod")
	}
}
