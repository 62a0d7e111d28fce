package sim

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/sim/cache"
)

func req(l int, h ...uint64) Request { return Request{InputLength: l, HashIDs: h} }

func replayHits(t *testing.T, p cache.Policy, reqs []Request) []int {
	t.Helper()
	res := Replay(reqs, p, 512, true)
	out := make([]int, len(res.PerRequest))
	for i, r := range res.PerRequest {
		out[i] = r.HitTokens
	}
	return out
}

func eqInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Mistake: forgetting min(k*block_size, L). Two resident blocks = 1024
// tokens, but the prompt is 700 tokens long: hit = 700.
func TestReplayPartialLastBlockClamp(t *testing.T) {
	got := replayHits(t, cache.NewLRU(10), []Request{req(700, 1, 2), req(700, 1, 2)})
	if !eqInts(got, []int{0, 700}) {
		t.Fatalf("hits %v, want [0 700]", got)
	}
}

// Mistake: set intersection instead of longest prefix. [9,2,3] shares 2 and 3
// with [1,2,3] but not block 0: hit 0. [1,2,7] shares the prefix [1,2]: 1024.
func TestReplayLongestPrefixNotIntersection(t *testing.T) {
	got := replayHits(t, cache.NewLRU(100), []Request{
		req(1536, 1, 2, 3), req(1536, 9, 2, 3), req(1536, 1, 2, 7),
	})
	if !eqInts(got, []int{0, 0, 1024}) {
		t.Fatalf("hits %v, want [0 0 1024]", got)
	}
}

// Mistake: counting ghost hits as residency. Capacity 10 (S=1): [1] then [2]
// pushes 1 (freq 0) to the ghost. [1] again: ghost is not resident -> hit 0,
// but the access moves 1 to M, so the next [1] hits (clamped to 300 tokens).
func TestReplayGhostIsNotResident(t *testing.T) {
	c, _ := cache.NewS3FIFO(10, 0.1, 3)
	got := replayHits(t, c, []Request{req(300, 1), req(300, 2), req(300, 1), req(300, 1)})
	if !eqInts(got, []int{0, 0, 0, 300}) {
		t.Fatalf("hits %v, want [0 0 0 300]", got)
	}
}

// Mistake: updating freq only on prefix hits. Request 2 = [3,2]: 3 is new so
// the prefix hit is 0, yet the already resident 2 still gets freq+1.
// Capacity 20, ratio 0.5: S=10, so nothing leaves S here.
func TestReplayFreqUpdatedBeyondPrefix(t *testing.T) {
	c, _ := cache.NewS3FIFO(20, 0.5, 3)
	got := replayHits(t, c, []Request{req(1024, 1, 2), req(1024, 3, 2)})
	if !eqInts(got, []int{0, 0}) {
		t.Fatalf("hits %v, want [0 0]", got)
	}
	if f, q := c.Freq(2); f != 1 || q != "S" {
		t.Fatalf("block 2: %q freq %d, want S freq 1", q, f)
	}
	if f, _ := c.Freq(3); f != 0 {
		t.Fatalf("block 3 freq %d, want 0", f)
	}
}

// Mistake: final_cache_blocks including the ghost. Five one-block requests on
// capacity 10 (S=1): S=[5], G=[1..4] -> final 1, not 5 (and not padded to 10).
func TestReplayFinalCacheBlocksExcludesGhost(t *testing.T) {
	c, _ := cache.NewS3FIFO(10, 0.1, 3)
	res := Replay([]Request{req(10, 1), req(10, 2), req(10, 3), req(10, 4), req(10, 5)}, c, 512, false)
	if res.FinalCacheBlocks != 1 {
		t.Fatalf("final_cache_blocks %d, want 1", res.FinalCacheBlocks)
	}
}

// Mistakes: ghost_cap = small_cap, freq reset on S->M, plain-FIFO main and
// head requeue, all visible in hit tokens. Capacity 4, ratio 0.25: S=1, M=3, G=3.
//
//	r1 [1,1] L=100: 1 new -> S; then freq 1.            hit 0
//	r2 [2,2]: 1 (f1) -> M keeping f1; 2 -> S f1.         hit 0
//	r3 [3,3]: 2 -> M f1; M=[1f1,2f1].                    hit 0
//	r4 [4,4]: 3 -> M f1; M=[1f1,2f1,3f1].                hit 0
//	r5 [5]:   4 (f1) promoted; M full: 1,2,3 requeued at the tail with f0,
//	          then 1 (f0) evicted to G. M=[2f0,3f0,4f1], S=[5f0]. hit 0
//	r6 [2]:   2 resident (M)                             hit 100; 2 -> f1
//	r7 [6]:   5 (f0) -> G. S=[6]. G=[1,5]                hit 0
//	r8 [1]:   1 in G: not resident                       hit 0; -> M f0:
//	          M full [2f1,3f0,4f1]: 2 requeued f0, 3 evicted to G.
//	          M=[4f1,2f0,1f0]
//	r9 [3]:   3 in G: not resident                       hit 0; -> M f0:
//	          M full [4f1,2f0,1f0]: 4 requeued f0, 2 evicted. M=[1f0,4f0,3f0], G=[5,2]
//	r10 [4]:  4 resident                                 hit 100; 4 -> f1
//	r11 [2]:  2 in G: not resident                       hit 0; -> M: 1 (f0) evicted.
//	          Final S=[6], M=[4f1,3f0,2f0], G=[5,1]: |S|,|M|,|G| = 1,3,2.
func TestReplayS3FIFOWorkedTrace(t *testing.T) {
	c, _ := cache.NewS3FIFO(4, 0.25, 3)
	got := replayHits(t, c, []Request{
		req(100, 1, 1), req(100, 2, 2), req(100, 3, 3), req(100, 4, 4),
		req(100, 5), req(100, 2), req(100, 6), req(100, 1), req(100, 3), req(100, 4), req(100, 2),
	})
	want := []int{0, 0, 0, 0, 0, 100, 0, 0, 0, 100, 0}
	if !eqInts(got, want) {
		t.Fatalf("hits %v, want %v", got, want)
	}
	if s, m, g := c.QueueLens(); s != 1 || m != 3 || g != 2 {
		t.Fatalf("|S|,|M|,|G| = %d,%d,%d, want 1,3,2", s, m, g)
	}
	// Mistake: implementing LRU instead of S3FIFO. LRU(4) on the same trace:
	// after r4 [1,2,3,4]; r5 evicts 1; r6 hits 2 -> [3,4,5,2]; r7 evicts 3;
	// r8 (1) evicts 4; r9 (3) evicts 5; r10 (4) misses (S3FIFO kept 4 in M
	// thanks to its freq); r11 misses.
	lru := replayHits(t, cache.NewLRU(4), []Request{
		req(100, 1, 1), req(100, 2, 2), req(100, 3, 3), req(100, 4, 4),
		req(100, 5), req(100, 2), req(100, 6), req(100, 1), req(100, 3), req(100, 4), req(100, 2),
	})
	if want := []int{0, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0}; !eqInts(lru, want) {
		t.Fatalf("LRU hits %v, want %v", lru, want)
	}
}

func loadTestTrace(t *testing.T, name string) []Request {
	t.Helper()
	reqs, err := ReadTraceFile("testdata/mooncake/" + name + ".jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// The seed's sanity checks on both real traces, all policies, and the
// unbounded ceilings the trace README states (37.4% / 65.1%).
func TestReplayRealTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the real traces")
	}
	for _, tc := range []struct {
		name    string
		n       int
		ceiling float64
	}{{"conversation_trace", 12031, 0.374}, {"synthetic_trace", 3993, 0.651}} {
		reqs := loadTestTrace(t, tc.name)
		if len(reqs) != tc.n {
			t.Fatalf("%s: %d requests, want %d", tc.name, len(reqs), tc.n)
		}
		h, tot := unboundedHitRate(reqs, 512)
		if r := float64(h) / float64(tot); math.Abs(r-tc.ceiling) > 0.0005 {
			t.Errorf("%s unbounded hit rate %.4f, want %.3f", tc.name, r, tc.ceiling)
		}
		// An LRU larger than every distinct block is the unbounded cache.
		big := Replay(reqs, cache.NewLRU(1<<22), 512, false)
		if big.TotalHitTokens != h {
			t.Errorf("%s: huge LRU %d hit tokens, unbounded %d", tc.name, big.TotalHitTokens, h)
		}
		for _, pol := range []string{"lru", "lfu", "s3fifo"} {
			p, _ := cache.New(cache.Config{Policy: pol, Capacity: 4096})
			res := Replay(reqs, p, 512, true)
			var sh, sp int64
			for _, r := range res.PerRequest {
				sh += int64(r.HitTokens)
				sp += int64(r.PromptTokens)
				if r.HitTokens > r.PromptTokens {
					t.Fatalf("%s/%s: hit %d > prompt %d", tc.name, pol, r.HitTokens, r.PromptTokens)
				}
			}
			if sh != res.TotalHitTokens || sp != res.TotalPromptTokens {
				t.Errorf("%s/%s: per-request sums %d/%d != totals %d/%d", tc.name, pol, sh, sp, res.TotalHitTokens, res.TotalPromptTokens)
			}
			if res.OverallHitRate != float64(res.TotalHitTokens)/float64(res.TotalPromptTokens) {
				t.Errorf("%s/%s: hit rate mismatch", tc.name, pol)
			}
			if res.FinalCacheBlocks > 4096 || res.TotalHitTokens > h {
				t.Errorf("%s/%s: final %d hits %d (ceiling %d)", tc.name, pol, res.FinalCacheBlocks, res.TotalHitTokens, h)
			}
			// First request: its first block was never seen -> 0.
			if res.PerRequest[0].HitTokens != 0 {
				t.Errorf("%s/%s: first request hit %d", tc.name, pol, res.PerRequest[0].HitTokens)
			}
		}
	}
}

func TestReadTraceGzipAndPlainAgree(t *testing.T) {
	plain := "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 7, \"hash_ids\": [0, 3]}\n\n" +
		"{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}"
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(plain))
	zw.Close()
	a, err := ReadTrace(strings.NewReader(plain))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadTrace(&zb)
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	want := `[{"timestamp":5,"input_length":600,"output_length":7,"hash_ids":[0,3]},{"timestamp":9,"input_length":10,"output_length":1,"hash_ids":[0]}]`
	if string(ja) != want || string(jb) != want {
		t.Fatalf("plain %s\ngzip %s\nwant %s", ja, jb, want)
	}
}
