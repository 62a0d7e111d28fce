package promises

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TestPeerRecoveryScale measures, on the shipped binary, the time to a
// complete index of KVINDEX_PEER_ENTRIES (block, pod) entries (16 pods,
// 512-block batches, each block held by one pod) two ways: a daemon filled
// by the engines' events (what a restart without a peer waits for, at best:
// every engine re-sending its whole cache as fast as the daemon applies
// it), and a daemon started with --peers copying that index, counted from
// its start until every pod is complete after one in-order batch. It is a
// measurement, not a check, and runs only when the variable is set:
//
//	KVINDEX_PEER_ENTRIES=1000000 go test ./internal/promises/ -run PeerRecoveryScale -v
func TestPeerRecoveryScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVINDEX_PEER_ENTRIES"))
	if n <= 0 {
		t.Skip("set KVINDEX_PEER_ENTRIES to measure recovery from a peer")
	}
	harness.Heavy(t)
	const pods, chain = 16, 512
	capacity := strconv.Itoa(n + n/2)
	first := harness.Start(t, "--admin-api", "--capacity", capacity)
	pub := first.Publisher()
	seqs := make([]uint64, pods)
	hashes := make([]uint64, chain)
	t0 := time.Now()
	for i := 0; i < n/chain; i++ {
		p := i % pods
		for j := range hashes {
			hashes[j] = uint64(i)*chain + uint64(j) + 1
		}
		publish(t, pub, fmt.Sprintf("pod-%02d", p), model, seqs[p],
			&event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes, BlockSize: blockSize}}})
		seqs[p]++
	}
	want := float64(n / chain * chain)
	wait.Until(t, "the engines' events applied", func() string {
		if v := first.Metric("kvindexd_index_entries"); v != want {
			return fmt.Sprintf("entries %v of %v", v, want)
		}
		return ""
	})
	fromEngines := time.Since(t0)

	t1 := time.Now()
	second := harness.Start(t, "--peers", "http://"+first.HTTP, "--capacity", capacity, "--peer-timeout", "5m")
	started := time.Since(t1)
	if v := second.Metric("kvindexd_peer_recovery_entries"); v != want {
		t.Fatalf("peer copy: %v entries, want %v", v, want)
	}
	pub2 := second.Publisher()
	one := []uint64{uint64(n) + 1000}
	for p := range pods {
		publish(t, pub2, fmt.Sprintf("pod-%02d", p), model, seqs[p],
			&event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: one, BlockSize: blockSize}}})
	}
	wait.Until(t, "every pod complete", func() string {
		for _, p := range second.Pods() {
			if !p.Complete || p.Stale {
				return fmt.Sprintf("%s: %+v", p.Pod, p)
			}
		}
		if len(second.Pods()) != pods {
			return "pods listed: " + strconv.Itoa(len(second.Pods()))
		}
		return ""
	})
	fromPeer := time.Since(t1)
	t.Logf("%d entries: from the engines' events %v; from a peer: process start to ready %v (copy %.1f MB fetched and loaded in %.2fs), to every pod complete %v",
		int(want), fromEngines.Round(time.Millisecond), started.Round(time.Millisecond),
		second.Metric("kvindexd_peer_recovery_bytes")/1e6, second.Metric("kvindexd_peer_recovery_seconds"), fromPeer.Round(time.Millisecond))
}
