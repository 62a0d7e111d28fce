package persist

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// fleet is an index with its interner, filled the way the applier fills it.
type fleet struct {
	in  *kvindex.Interner
	idx *kvindex.MemoryIndex
}

func newFleet(capacity int64) *fleet {
	return &fleet{in: kvindex.NewInterner(), idx: kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: capacity})}
}

func (f *fleet) add(t testing.TB, model, pod string, rank int, tier event.Tier, keys []blockkeys.Key) {
	t.Helper()
	if err := f.idx.Add(context.Background(), f.in.Model(model), f.in.Pod(pod, rank), tier, keys); err != nil {
		t.Fatal(err)
	}
}

// holders is what a lookup of (model, key) returns, by pod name and rank.
func (f *fleet) holders(t testing.TB, model string, k blockkeys.Key) []string {
	t.Helper()
	m, ok := f.in.LookupModel(model)
	if !ok {
		return nil
	}
	var v visitor
	if err := f.idx.Lookup(context.Background(), m, []blockkeys.Key{k}, &v); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range v.hs {
		name, rank := f.in.PodName(h.Pod)
		out = append(out, name+"/"+string(rune('0'+rank))+"/"+h.Tier.String())
	}
	slices.Sort(out)
	return out
}

type visitor struct{ hs []kvindex.Holder }

func (v *visitor) Visit(_ int, _ blockkeys.Key, hs []kvindex.Holder) bool {
	v.hs = append(v.hs[:0], hs...)
	return true
}

func keys(rng *rand.Rand, n int) []blockkeys.Key {
	out := make([]blockkeys.Key, n)
	for i := range out {
		out[i] = blockkeys.Key(rng.Uint64())
	}
	return out
}

func sample(t *testing.T) (*fleet, map[string][]blockkeys.Key) {
	f := newFleet(1 << 20)
	rng := rand.New(rand.NewPCG(7, 7))
	shared := keys(rng, 300)
	byModel := map[string][]blockkeys.Key{"org/model-a": shared, "org/model-b": keys(rng, 200)}
	f.add(t, "org/model-a", "pod-1", 0, event.TierGPU, shared)
	f.add(t, "org/model-a", "pod-2", 0, event.TierCPU, shared[:150])
	f.add(t, "org/model-a", "pod-3", 1, event.TierGPU, shared[100:])
	f.add(t, "org/model-b", "pod-2", 0, event.TierDisk, byModel["org/model-b"])
	f.add(t, "org/model-b", "gone", 0, event.TierGPU, byModel["org/model-b"])
	if err := f.idx.ClearPod(context.Background(), f.in.Pod("gone", 0)); err != nil {
		t.Fatal(err)
	}
	return f, byModel
}

func write(t testing.TB, f *fleet, path string, seqs []StreamSeq) Written {
	t.Helper()
	w, err := Write(path, Source{Index: f.idx, Interner: f.in, Streams: func() []StreamSeq { return seqs }}, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestRoundTrip(t *testing.T) {
	f, byModel := sample(t)
	path := filepath.Join(t.TempDir(), "index.snap")
	w := write(t, f, path, []StreamSeq{{Pod: "pod-1", Seq: 41}, {Pod: "pod-3", DPRank: 1, Seq: 7}})
	if w.Entries != f.idx.Stats().Entries {
		t.Fatalf("wrote %d entries, index holds %d", w.Entries, f.idx.Stats().Entries)
	}
	matches, _ := filepath.Glob(path + ".tmp-*")
	if len(matches) != 0 {
		t.Fatalf("temporary files left: %v", matches)
	}
	g := newFleet(1 << 20)
	l, err := Load(path, g.idx, g.in)
	if err != nil {
		t.Fatal(err)
	}
	if l.Entries != w.Entries || l.Blocks != w.Blocks || !l.Created.Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("loaded %+v, wrote %+v", l, w)
	}
	seqs := map[string]RestoredPod{}
	for _, p := range l.Pods {
		seqs[p.Name] = p
	}
	if p := seqs["pod-1"]; !p.HasSeq || p.Seq != 41 {
		t.Errorf("pod-1: %+v", p)
	}
	if p := seqs["pod-2"]; p.HasSeq {
		t.Errorf("pod-2 has no stream but got %+v", p)
	}
	if p := seqs["pod-3"]; !p.HasSeq || p.Seq != 7 || p.DPRank != 1 {
		t.Errorf("pod-3: %+v", p)
	}
	for model, ks := range byModel {
		for _, k := range ks {
			if a, b := f.holders(t, model, k), g.holders(t, model, k); !slices.Equal(a, b) {
				t.Fatalf("%s %x: before %v, after %v", model, k, a, b)
			}
		}
	}
	if g.idx.Stats().Entries != f.idx.Stats().Entries {
		t.Errorf("entries %d after load, %d before", g.idx.Stats().Entries, f.idx.Stats().Entries)
	}
	// Bounded: a few bytes per entry.
	if w.Bytes > 12*w.Entries+1024 {
		t.Errorf("%d bytes for %d entries", w.Bytes, w.Entries)
	}
}

// A model table that does not intern to the same ids (the interner already
// knows another model) is refused: slot keys would land under wrong models.
func TestModelTableMismatch(t *testing.T) {
	f, _ := sample(t)
	path := filepath.Join(t.TempDir(), "index.snap")
	write(t, f, path, nil)
	g := newFleet(1 << 20)
	g.in.Model("some/other")
	if _, err := Load(path, g.idx, g.in); err == nil {
		t.Fatal("loaded into an interner with another model table")
	}
	if g.idx.Stats().Entries != 0 {
		t.Fatal("entries visible after a refused load")
	}
}

// Every truncation and random corruption is an error, never a panic, and
// leaves no entry visible.
func TestCorruptFiles(t *testing.T) {
	f, _ := sample(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "index.snap")
	write(t, f, path, []StreamSeq{{Pod: "pod-1", Seq: 3}})
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.snap")
	try := func(what string, b []byte) {
		t.Helper()
		if err := os.WriteFile(bad, b, 0o600); err != nil {
			t.Fatal(err)
		}
		g := newFleet(1 << 20)
		if _, err := Load(bad, g.idx, g.in); err == nil {
			t.Fatalf("%s: loaded", what)
		}
		if n := g.idx.Stats().Entries; n != 0 {
			t.Fatalf("%s: %d entries visible after a failed load", what, n)
		}
	}
	for n := 0; n < len(good); n += 1 + n/50 {
		try("truncated", good[:n])
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		b := slices.Clone(good)
		b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		try("bit flip", b)
	}
	// Corrupt content with a valid checksum: the parser's own checks.
	body := good[:len(good)-4]
	withCRC := func(b []byte) []byte {
		return binary.LittleEndian.AppendUint32(slices.Clone(b), crc32.Checksum(b, castagnoli))
	}
	for i := len(magic) + 4; i < len(body); i += 1 + i/40 {
		b := slices.Clone(body)
		b[i] ^= 0xff
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("panic on corrupt byte %d: %v", i, r)
				}
			}()
			g := newFleet(1 << 20)
			_, err := Load(writeTmp(t, dir, withCRC(b)), g.idx, g.in)
			if err != nil && g.idx.Stats().Entries != 0 {
				t.Fatalf("byte %d: entries visible after a failed load", i)
			}
		}()
	}
	// A huge count must not allocate: the parser refuses counts beyond the file.
	huge := slices.Clone(body[:len(magic)+4+8+8])
	huge = binary.AppendUvarint(huge, 1<<60)
	try("huge model count", withCRC(huge))
	var wrongVersion []byte
	wrongVersion = append(wrongVersion, magic...)
	wrongVersion = binary.LittleEndian.AppendUint32(wrongVersion, 99)
	wrongVersion = append(wrongVersion, make([]byte, 24)...)
	g := newFleet(1 << 20)
	if _, err := Load(writeTmp(t, dir, withCRC(wrongVersion)), g.idx, g.in); err == nil || !bytes.Contains([]byte(err.Error()), []byte("version 99")) {
		t.Errorf("version 99: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing"), g.idx, g.in); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func writeTmp(t *testing.T, dir string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, "crafted.snap")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A failed write leaves the previous snapshot as it was.
func TestFailedWriteKeepsPrevious(t *testing.T) {
	f, _ := sample(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "index.snap")
	write(t, f, path, nil)
	before, _ := os.ReadFile(path)
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() == 0 {
		t.Skip("root ignores directory permissions")
	}
	if _, err := Write(path, Source{Index: f.idx, Interner: f.in}, time.Now()); err == nil {
		t.Fatal("write into a read-only directory succeeded")
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("the previous snapshot changed")
	}
}

func FuzzLoad(f *testing.F) {
	fl := newFleet(1 << 16)
	fl.add(f, "m", "p", 0, event.TierGPU, []blockkeys.Key{1, 2, 3})
	fl.add(f, "m", "q", 2, event.TierCPU, []blockkeys.Key{2, 3})
	dir := f.TempDir()
	path := filepath.Join(dir, "seed.snap")
	write(f, fl, path, []StreamSeq{{Pod: "p", Seq: 9}})
	good, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	// The fuzzer mutates the body; the checksum is recomputed so the
	// parser behind it is what gets exercised.
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 4 {
			b = binary.LittleEndian.AppendUint32(b[:len(b)-4:len(b)-4], crc32.Checksum(b[:len(b)-4], castagnoli))
		}
		p := filepath.Join(t.TempDir(), "f.snap")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		g := newFleet(1 << 16)
		if _, err := Load(p, g.idx, g.in); err != nil && g.idx.Stats().Entries != 0 {
			t.Fatal("entries visible after a failed load")
		}
	})
}

// ranger runs during once, at the first block of the walk.
type ranger struct {
	idx    *kvindex.MemoryIndex
	during func()
}

func (r ranger) RangeBlocks(fn func(kvindex.SlotKey, []kvindex.Holder) error) error {
	first := true
	return r.idx.RangeBlocks(func(k kvindex.SlotKey, hs []kvindex.Holder) error {
		if first {
			first = false
			r.during()
		}
		return fn(k, hs)
	})
}

// A model interned while the blocks are walked makes the write fail rather
// than record blocks of a model the table does not name; the previous
// snapshot stays.
func TestModelAddedDuringWrite(t *testing.T) {
	f, _ := sample(t)
	path := filepath.Join(t.TempDir(), "index.snap")
	write(t, f, path, nil)
	before, _ := os.ReadFile(path)
	_, err := Write(path, Source{Index: ranger{f.idx, func() { f.in.Model("during/walk") }}, Interner: f.in}, time.Now())
	if err == nil {
		t.Fatal("a model interned during the walk was not noticed")
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("the previous snapshot changed")
	}
	if _, err := Write(path, Source{Index: f.idx, Interner: f.in}, time.Now()); err != nil {
		t.Fatalf("the next write: %v", err)
	}
}

// A file with a valid checksum is still held to what events may create: pod and model
// names that events would drop (invalid UTF-8, control characters, too long), more pods
// or models than the limits, DP ranks beyond them. Such a file is refused as ErrInvalid
// before the bad name is interned (an interned name becomes a /metrics label).
func TestLoadHoldsFileToEventLimits(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(9, 9))
	ks := keys(rng, 10)
	for _, tc := range []struct {
		name         string
		model, pod   string
		rank         int
		lim          Limits
		wantAccepted bool
	}{
		{name: "valid", model: "org/m", pod: "pod-a", wantAccepted: true},
		{name: "pod_invalid_utf8", model: "org/m", pod: "pod-\xff\xfe"},
		{name: "pod_control_char", model: "org/m", pod: "pod\n1"},
		{name: "pod_del_char", model: "org/m", pod: "pod\x7f"},
		{name: "pod_254_bytes", model: "org/m", pod: strings.Repeat("p", 254)},
		{name: "pod_65536_bytes", model: "org/m", pod: strings.Repeat("p", 65536)},
		{name: "model_invalid_utf8", model: "org/\xc3", pod: "pod-a"},
		{name: "model_257_bytes", model: strings.Repeat("m", 257), pod: "pod-a"},
		{name: "rank_2^30", model: "org/m", pod: "pod-a", rank: 1 << 30},
		{name: "rank_64", model: "org/m", pod: "pod-a", rank: 64},
		{name: "rank_63", model: "org/m", pod: "pod-a", rank: 63, wantAccepted: true},
		{name: "more_pods_than_streams", model: "org/m", pod: "pod-a", lim: Limits{MaxPods: 1}},
		{name: "more_models_than_allowed", model: "org/m", pod: "pod-a", lim: Limits{MaxModels: 1}},
		{name: "ranks_below_the_limit", model: "org/m", pod: "pod-a", rank: 5, lim: Limits{MaxDPRanks: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(1 << 10)
			f.add(t, tc.model, tc.pod, tc.rank, event.TierGPU, ks)
			f.add(t, "org/other", "pod-b", 0, event.TierGPU, ks)
			path := filepath.Join(dir, tc.name+".snap")
			write(t, f, path, nil)
			g := newFleet(1 << 10)
			l, err := LoadLimited(path, g.idx, g.in, tc.lim)
			if tc.wantAccepted {
				if err != nil || len(l.Pods) != 2 {
					t.Fatalf("refused a valid file: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if n := g.idx.Stats().Entries; n != 0 {
				t.Fatalf("%d entries visible", n)
			}
			if _, ok := g.in.LookupPod(tc.pod, tc.rank); ok && tc.lim == (Limits{}) {
				t.Fatalf("the refused pod name was interned")
			}
		})
	}
}

// Temporary files of writes a kill interrupted are removed; the snapshot itself, other
// files and other snapshots' temporary files are not.
func TestRemoveTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "snap.bin")
	for _, n := range []string{"snap.bin", "snap.bin.tmp-123", "snap.bin.tmp-456", "other.bin.tmp-1", "snap.bin.bak"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "snap.bin.tmp-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveTemp(path)
	if err != nil || n != 2 {
		t.Fatalf("RemoveTemp = %d, %v; want 2", n, err)
	}
	var left []string
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		left = append(left, e.Name())
	}
	if want := []string{"other.bin.tmp-1", "snap.bin", "snap.bin.bak", "snap.bin.tmp-dir"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
}
