//go:build linux

package kvindex_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/persist"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// TestScale measures the in-memory index at fleet scale: fill rate, memory
// (Go heap and RSS) and where it goes, score latency against the same
// probe prompts at 1M and at the full size, and snapshot write and restore
// at the full size. At 100M entries it peaks at about 4.5 GB RSS and takes
// 3-10 minutes, so it runs only when asked:
//
//	KVINDEX_SCALE=1 go test ./kvindex/ -run '^TestScale$' -v -timeout 60m
//
// KVINDEX_SCALE_ENTRIES sets the full size (default 100M (block, pod)
// entries), KVINDEX_SCALE_DIR where the snapshot file goes (default a
// temporary directory; it is about 10 bytes per entry);
// KVINDEX_SCALE_SNAPSHOT=0 skips the snapshot part.
//
// The fleet: 8 pods, one model. Most of the index is background
// conversations, chains of 512 blocks each stored by one pod and a quarter
// of them by a second pod too (1.25 holders per key, the sharing that
// BenchmarkBytesPerEntry calls "shared"). The probes, the same at both
// sizes: 256 "staircase" prompts of 512 blocks of which pod p holds the
// first 64(p+1) (BenchmarkScore512x8Cold's shape), 8 prompts of which 64
// pods hold staircases 8 blocks apart (x64), and a spread of background
// chains (1-2 holders each). Each figure rotates through its prompts, so
// the slots it reads are mostly not in cache; it is reported as wall and
// as the scoring thread's CPU time per call, the latter unaffected by
// other processes taking the CPU.
func TestScale(t *testing.T) {
	if os.Getenv("KVINDEX_SCALE") == "" {
		t.Skip("set KVINDEX_SCALE=1 to measure the index at 100M entries (peaks at ~4.5 GB, minutes)")
	}
	entries := int64(100_000_000)
	if s := os.Getenv("KVINDEX_SCALE_ENTRIES"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 2_000_000 {
			t.Fatalf("KVINDEX_SCALE_ENTRIES=%q: want an integer >= 2000000", s)
		}
		entries = n
	}
	dir := os.Getenv("KVINDEX_SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	t.Logf("load average at start: %s", loadAvg())

	// The 1M figure, then the index is dropped before the big fill.
	small := buildScaleFleet(t, 1_000_000)
	smallScores := small.scoreAll(t)
	small = nil
	resetPeak()
	readMem()

	f := buildScaleFleet(t, entries)
	m := readMem()
	st := f.idx.Stats()
	br := kvindex.Breakdown(f.idx)
	t.Logf("memory at %d entries (%d keys, %.3f holders/key): heap in use %s (%.1f B/entry), heap alloc %s, runtime sys %s, RSS %s (%.1f B/entry), peak RSS during the fill %s, in huge pages %s",
		st.Entries, st.Keys, float64(st.Entries)/float64(st.Keys), gb(m.heapInuse), float64(m.heapInuse)/float64(st.Entries),
		gb(m.heapAlloc), gb(m.sys), gb(m.rss), float64(m.rss)/float64(st.Entries), gb(m.hwm), gb(m.thp))
	t.Logf("breakdown: %d shards, keys per shard %d-%d; slot tables %s (%d slots, load %.2f); arenas %s allocated, %s handed out, %s in free chunks; free lists %s",
		br.Shards, br.MinShardKeys, br.MaxShard, gb(uint64(br.TableBytes)), br.Slots, float64(br.Keys)/float64(br.Slots),
		gb(uint64(br.ArenaCap*8)), gb(uint64(br.ArenaUsed*8)), gb(uint64(br.FreeWords*8)), gb(uint64(br.FreeListBytes)))
	if st.Evictions != 0 {
		t.Fatalf("the fill evicted %d entries: the capacity is too small for the shape", st.Evictions)
	}

	bigScores := f.scoreAll(t)
	for i, s := range bigScores {
		b := smallScores[i]
		t.Logf("score %s: 1M %.2f us wall / %.2f us CPU; %dM %.2f us wall / %.2f us CPU; ratio (CPU) %.2f",
			s.name, b.wall/1e3, b.cpu/1e3, entries/1_000_000, s.wall/1e3, s.cpu/1e3, s.cpu/b.cpu)
	}

	if os.Getenv("KVINDEX_SCALE_SNAPSHOT") == "0" {
		return
	}
	// Snapshot write, then a restart: the index is dropped and the file
	// loaded into a fresh one, as the daemon does before it serves.
	path := filepath.Join(dir, "scale.snap")
	defer os.Remove(path)
	c0, t0 := cpuTime(), time.Now()
	w, err := persist.Write(path, persist.Source{Index: f.idx, Interner: f.in}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wrote, wroteCPU := time.Since(t0), cpuTime()-c0
	if w.Entries != st.Entries {
		t.Fatalf("snapshot holds %d entries, index %d", w.Entries, st.Entries)
	}
	t.Logf("snapshot write: %d blocks, %d entries, %.1f MB (%.2f B/entry) in %v wall, %v CPU",
		w.Blocks, w.Entries, float64(w.Bytes)/1e6, float64(w.Bytes)/float64(w.Entries), wrote.Round(time.Millisecond), wroteCPU.Round(time.Millisecond))
	probes := f.stairs
	f = nil
	readMem()
	resetPeak()

	g := &scaleFleet{in: kvindex.NewInterner(), idx: kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: scaleCapacity(entries)})}
	c0, t0 = cpuTime(), time.Now()
	l, err := persist.Load(path, g.idx, g.in)
	if err != nil {
		t.Fatal(err)
	}
	loaded, loadedCPU := time.Since(t0), cpuTime()-c0
	if l.Entries != st.Entries || g.idx.Stats().Entries != st.Entries {
		t.Fatalf("loaded %d entries, index holds %d, want %d", l.Entries, g.idx.Stats().Entries, st.Entries)
	}
	m = readMem()
	t.Logf("snapshot load: %v wall, %v CPU (%.1fM entries/s wall); then heap in use %s, RSS %s, peak RSS during the load %s",
		loaded.Round(time.Millisecond), loadedCPU.Round(time.Millisecond), float64(l.Entries)/loaded.Seconds()/1e6,
		gb(m.heapInuse), gb(m.rss), gb(m.hwm))
	g.model, _ = g.in.LookupModel(scaleModel)
	g.stairs = probes
	s := g.measure(t, "512x8 staircase after load", g.stairs, 8)
	t.Logf("score %s: %.2f us wall / %.2f us CPU", s.name, s.wall/1e3, s.cpu/1e3)
	t.Logf("load average at end: %s", loadAvg())
}

const (
	scaleModel   = "org/model"
	chainLen     = 512
	stairPrompts = 256
	widePrompts  = 8
	widePods     = 64
)

// scaleKey derives well-spread keys; set keeps the fixture's parts apart.
func scaleKey(set, i uint64) blockkeys.Key {
	x := set<<40 | i
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return blockkeys.Key(x ^ x>>31)
}

// scaleCapacity leaves room for shards filling unevenly: a shard at its
// share of the bound would start evicting.
func scaleCapacity(entries int64) int64 { return entries + entries/4 + 1<<20 }

type scaleFleet struct {
	in     *kvindex.Interner
	idx    *kvindex.MemoryIndex
	model  kvindex.ModelID
	pods   []kvindex.PodID
	stairs [][]blockkeys.Key // x8 staircase probes
	wide   [][]blockkeys.Key // x64 staircase probes
	chains [][]blockkeys.Key // background chains used as probes
}

// buildScaleFleet fills a fresh index to at least entries entries and logs
// the fill rate.
func buildScaleFleet(t *testing.T, entries int64) *scaleFleet {
	ctx := context.Background()
	f := &scaleFleet{in: kvindex.NewInterner(), idx: kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: scaleCapacity(entries)})}
	f.model = f.in.Model(scaleModel)
	for p := range widePods {
		f.pods = append(f.pods, f.in.Pod("pod-"+strconv.Itoa(p), 0))
	}
	add := func(p int, keys []blockkeys.Key) {
		if err := f.idx.Add(ctx, f.model, f.pods[p], event.TierGPU, keys); err != nil {
			t.Fatal(err)
		}
	}
	prompt := func(set, q uint64) []blockkeys.Key {
		keys := make([]blockkeys.Key, chainLen)
		for i := range keys {
			keys[i] = scaleKey(set, q*chainLen+uint64(i))
		}
		return keys
	}
	for q := range stairPrompts {
		keys := prompt(1, uint64(q))
		for p := range 8 {
			add(p, keys[:chainLen*(p+1)/8])
		}
		f.stairs = append(f.stairs, keys)
	}
	for q := range widePrompts {
		keys := prompt(2, uint64(q))
		for p := range widePods {
			add(p, keys[:chainLen*(p+1)/widePods])
		}
		f.wide = append(f.wide, keys)
	}
	probeEntries := f.idx.Stats().Entries

	c0, t0 := cpuTime(), time.Now()
	keys := make([]blockkeys.Key, chainLen)
	var added int64
	chains := 0
	for n := probeEntries; n < entries; chains++ {
		c := uint64(chains)
		for i := range keys {
			keys[i] = scaleKey(3, c*chainLen+uint64(i))
		}
		p := int(c % 8)
		add(p, keys)
		n += chainLen
		added += chainLen
		if scaleKey(4, c)&3 == 0 { // a quarter also on a second pod
			add((p+1+int(c/8%7))%8, keys)
			n += chainLen
			added += chainLen
		}
	}
	took, cpu := time.Since(t0), cpuTime()-c0
	t.Logf("fill to %d entries (%d background chains of %d blocks): %v wall, %v CPU (process, GC included): %.2fM entries/s wall, %.2fM entries per CPU-second",
		f.idx.Stats().Entries, chains, chainLen, took.Round(time.Millisecond), cpu.Round(time.Millisecond),
		float64(added)/took.Seconds()/1e6, float64(added)/cpu.Seconds()/1e6)
	// 1024 chains spread over the whole fill (all of them when fewer)
	step := max(1, chains/1024)
	for c := 0; c < chains && len(f.chains) < 1024; c += step {
		k := make([]blockkeys.Key, chainLen)
		for i := range k {
			k[i] = scaleKey(3, uint64(c)*chainLen+uint64(i))
		}
		f.chains = append(f.chains, k)
	}
	return f
}

type scoreFig struct {
	name      string
	wall, cpu float64 // ns per call
	calls     int
}

func (f *scaleFleet) scoreAll(t *testing.T) []scoreFig {
	return []scoreFig{
		f.measure(t, "512x8 staircase", f.stairs, 8),
		f.measure(t, "512x64 staircase", f.wide, widePods),
		f.measure(t, "512 background chain (1-2 pods)", f.chains, 0),
	}
}

// measure scores prompts in rotation for about two seconds on one locked
// thread and returns wall and thread CPU time per call. wantPods is the
// pod count every result must have (0: one or two).
func (f *scaleFleet) measure(t *testing.T, name string, prompts [][]blockkeys.Key, wantPods int) scoreFig {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := kvindex.NewScorer(f.idx, f.idx, kvindex.DefaultTierWeights())
	ctx := context.Background()
	var res kvindex.ScoreResult
	for _, keys := range prompts { // every prompt checked once
		if err := s.Score(ctx, f.model, keys, nil, &res); err != nil {
			t.Fatal(err)
		}
		ok := len(res.Pods) == wantPods || (wantPods == 0 && (len(res.Pods) == 1 || len(res.Pods) == 2))
		if !ok || res.Pods[0].MatchedBlocks != chainLen {
			t.Fatalf("%s: fixture broken: %+v", name, res.Pods)
		}
	}
	runtime.GC()        // not during the timing, as far as possible
	const stride = 7919 // prime: visits every prompt
	n := 0
	c0, t0 := threadCPU(), time.Now()
	for time.Since(t0) < 2*time.Second {
		for range 64 {
			if err := s.Score(ctx, f.model, prompts[n*stride%len(prompts)], nil, &res); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	wall, cpu := time.Since(t0), threadCPU()-c0
	return scoreFig{name: name, wall: float64(wall.Nanoseconds()) / float64(n), cpu: float64(cpu.Nanoseconds()) / float64(n), calls: n}
}

type memFig struct{ heapInuse, heapAlloc, sys, rss, hwm, thp uint64 }

// readMem collects garbage, returns freed pages to the OS, and reads the
// heap and the process's resident set (now and peak).
func readMem() memFig {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := memFig{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, sys: ms.Sys}
	fd, err := os.Open("/proc/self/status")
	if err != nil {
		return m
	}
	defer fd.Close()
	sc := bufio.NewScanner(fd)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.rss = kb << 10
		case "VmHWM":
			m.hwm = kb << 10
		}
	}
	if b, err := os.ReadFile("/proc/self/smaps_rollup"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "AnonHugePages:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.thp = kb << 10
			}
		}
	}
	return m
}

// resetPeak resets VmHWM (Linux 4.0+; best effort).
func resetPeak() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func gb(b uint64) string { return strconv.FormatFloat(float64(b)/1e9, 'f', 3, 64) + " GB" }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func rusage(who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuTime is the process's CPU time, all threads.
func cpuTime() time.Duration { return rusage(syscall.RUSAGE_SELF) }

// threadCPU is the calling thread's CPU time (RUSAGE_THREAD).
func threadCPU() time.Duration { return rusage(1) }
