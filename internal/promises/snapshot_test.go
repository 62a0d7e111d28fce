package promises

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/persist"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// writeSnapshot writes a snapshot file (valid checksum) holding one block for each
// (pod, rank) given, all under model.
func writeSnapshot(t *testing.T, path string, pods map[string]int) {
	t.Helper()
	in := kvindex.NewInterner()
	idx := kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
	m := in.Model(model)
	var seqs []persist.StreamSeq
	for name, rank := range pods {
		if err := idx.Add(context.Background(), m, in.Pod(name, rank), event.TierGPU, []blockkeys.Key{blockkeys.Key(len(seqs) + 1)}); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, persist.StreamSeq{Pod: name, DPRank: rank, Seq: 5})
	}
	if _, err := persist.Write(path, persist.Source{Index: idx, Interner: in, Streams: func() []persist.StreamSeq { return seqs }}, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// Issue 26 item 13: a snapshot with a valid checksum is held to the limits of events.
// Files naming a pod with invalid UTF-8, a control character or 65,536 bytes, a DP rank
// of 2^30, or more pods than --max-streams are refused (cold start, counted), nothing of
// them is interned, so /metrics keeps answering; the temporary files of interrupted
// writes next to the snapshot are removed at start.
func TestPromiseSnapshotValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		pods  map[string]int
		flags []string
	}{
		{"invalid_utf8", map[string]int{"pod-ok": 0, "pod-\xff\xfe": 0}, nil},
		{"control_char", map[string]int{"pod-ok": 0, "pod\x1b[31m": 0}, nil},
		{"65536_bytes", map[string]int{"pod-ok": 0, strings.Repeat("p", 65536): 0}, nil},
		{"rank_2^30", map[string]int{"pod-ok": 0, "pod-rank": 1 << 30}, nil},
		{"more_pods_than_max_streams", map[string]int{"pod-ok": 0, "pod-two": 0}, []string{"--max-streams=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, "snap.bin")
			writeSnapshot(t, path, tc.pods)
			for i := range 3 {
				if err := os.WriteFile(fmt.Sprintf("%s.tmp-%d", path, i), make([]byte, 1<<16), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			d := harness.Start(t, append([]string{"--snapshot-path", path}, tc.flags...)...)
			if v := d.Metric(`kvindexd_snapshot_load_failures_total{reason="invalid"}`); v != 1 {
				t.Errorf(`snapshot_load_failures_total{reason="invalid"} = %v, want 1`, v)
			}
			if v := d.Metric("kvindexd_snapshot_restored_entries"); v != 0 {
				t.Errorf("restored entries %v, want 0 (cold start)", v)
			}
			if ps := d.Pods(); len(ps) != 0 {
				t.Errorf("/v1/pods lists %d pods of a refused snapshot", len(ps))
			}
			if v := d.Metric("kvindexd_snapshot_temp_files_removed_total"); v != 3 {
				t.Errorf("temp_files_removed_total = %v, want 3", v)
			}
			if left, _ := filepath.Glob(path + ".tmp-*"); len(left) != 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// Issue 35: a snapshot file dated in the future has no age --snapshot-max-age can
// bound (dated 2200, it would be loaded for ever): beyond a minute's clock skew it
// is refused like a stale one (cold start, logged); one dated now is loaded.
func TestPromiseSnapshotDatedInTheFutureIsNotLoaded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mtime   time.Time
		entries float64
	}{
		{"year_2200", time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), 0},
		{"now", time.Now(), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "snap.bin")
			writeSnapshot(t, path, map[string]int{"pod-a": 0})
			if err := os.Chtimes(path, tc.mtime, tc.mtime); err != nil {
				t.Fatal(err)
			}
			d := harness.Start(t, "--snapshot-path", path)
			if v := d.Metric("kvindexd_snapshot_restored_entries"); v != tc.entries {
				t.Errorf("restored entries %v, want %v", v, tc.entries)
			}
			if future := strings.Contains(d.Logs.String(), "snapshot dated in the future"); future != (tc.entries == 0) {
				t.Errorf("log says the file is dated in the future: %v", future)
			}
		})
	}
}
