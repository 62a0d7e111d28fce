package persist

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// bigFleet fills an index with entries (block, pod) entries: 16 pods, each
// block held by two of them, chains of 512 blocks per prompt.
func bigFleet(tb testing.TB, entries int) *fleet {
	f := newFleet(int64(entries) + int64(entries)/4)
	blocks := entries / 2
	chain := make([]blockkeys.Key, 512)
	for b := 0; b < blocks; b += len(chain) {
		n := min(len(chain), blocks-b)
		for i := range n {
			chain[i] = blockkeys.Key(uint64(b+i)*0x9e3779b97f4a7c15 + 1)
		}
		p := (b / len(chain)) % 16
		f.add(tb, "org/model", "pod-"+strconv.Itoa(p), 0, event.TierGPU, chain[:n])
		f.add(tb, "org/model", "pod-"+strconv.Itoa((p+1)%16), 0, event.TierCPU, chain[:n])
	}
	return f
}

// TestRestartToWarm10M measures the restart-to-warm time of a 10M-entry
// index: write the snapshot, then load it into a fresh index (what a
// restarted daemon does before it serves). It needs ~1.5 GB and runs only
// with KVINDEX_SNAPSHOT_10M=1:
//
//	KVINDEX_SNAPSHOT_10M=1 go test ./indexer/persist/ -run RestartToWarm10M -v
func TestRestartToWarm10M(t *testing.T) {
	if os.Getenv("KVINDEX_SNAPSHOT_10M") == "" {
		t.Skip("set KVINDEX_SNAPSHOT_10M=1 to measure restart-to-warm at 10M entries")
	}
	const entries = 10_000_000
	f := bigFleet(t, entries)
	if got := f.idx.Stats().Entries; got != entries {
		t.Fatalf("fleet has %d entries", got)
	}
	path := filepath.Join(t.TempDir(), "10m.snap")
	t0 := time.Now()
	w := write(t, f, path, nil)
	wrote := time.Since(t0)
	f = nil
	runtime.GC()

	g := newFleet(entries + entries/4)
	t0 = time.Now()
	l, err := Load(path, g.idx, g.in)
	if err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(t0)
	if l.Entries != entries || g.idx.Stats().Entries != entries {
		t.Fatalf("loaded %d entries, index holds %d", l.Entries, g.idx.Stats().Entries)
	}
	t.Logf("10M entries: snapshot %.1f MB (%.2f B/entry), write %v, restart-to-warm (load) %v (%.1fM entries/s)",
		float64(w.Bytes)/1e6, float64(w.Bytes)/entries, wrote.Round(time.Millisecond), loaded.Round(time.Millisecond),
		entries/loaded.Seconds()/1e6)
}

// BenchmarkLoad1M loads a 1M-entry snapshot into a fresh index.
func BenchmarkLoad1M(b *testing.B) {
	f := bigFleet(b, 1<<20)
	path := filepath.Join(b.TempDir(), "1m.snap")
	w := write(b, f, path, nil)
	b.SetBytes(w.Bytes)
	b.ResetTimer()
	for b.Loop() {
		g := newFleet(1<<20 + 1<<18)
		if _, err := Load(path, g.idx, g.in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(w.Entries)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mentries/s")
}

// BenchmarkWrite1M writes a 1M-entry snapshot.
func BenchmarkWrite1M(b *testing.B) {
	f := bigFleet(b, 1<<20)
	path := filepath.Join(b.TempDir(), "1m.snap")
	for b.Loop() {
		write(b, f, path, nil)
	}
	b.ReportMetric(float64(1<<20)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mentries/s")
}
