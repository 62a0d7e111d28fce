package applier

import (
	"context"
	"fmt"
	"math/bits"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/setassoc"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A hash stored twice (two physical copies) and removed once stays indexed:
// without remaining_copy_counts the applier counts copies itself, in a
// table of every block (an index that cannot say what a pod held: Redis) or
// from the index's answer (kvindex.HeldAdder: the in-memory index).
func TestApplierCopiesCounted(t *testing.T) {
	for _, reportsHeld := range []bool{false, true} {
		t.Run(fmt.Sprintf("reportsHeld=%v", reportsHeld), func(t *testing.T) {
			testApplierCopiesCounted(t, reportsHeld)
		})
	}
}

func testApplierCopiesCounted(t *testing.T, reportsHeld bool) {
	e := newApplierEnvHeld(t, cborSeed0, reportsHeld)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1)) // a second copy of block 0
	id := e.podID("p", 0)
	if p := e.pod("p", 0); p.BlocksStored != 2 {
		t.Fatalf("blocks stored %d, want 2 (the second copy is not a stored block)", p.BlocksStored)
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh})
	if !e.idx.has(id, blockkeys.Key(eh[0])) || e.idx.has(id, blockkeys.Key(eh[1])) {
		t.Fatalf("after one removal: %v", e.idx.held)
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:1]})
	if e.idx.count(id) != 0 {
		t.Fatalf("last copy removed but block held: %v", e.idx.held)
	}
	if p := e.pod("p", 0); p.CopiesKept != 1 {
		t.Fatalf("copies kept %d", p.CopiesKept)
	}
	if e.metric("kvindexd_copies_kept_total") != 1 {
		t.Fatal("metric")
	}
	// Copies are per tier: the CPU copy is a separate holder.
	cpu := stored(eh, toks, 4, 0, 1)
	cpu.Medium = event.TierCPU
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1), cpu)
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:1], Medium: event.TierCPU})
	if !e.idx.has(id, blockkeys.Key(eh[0])) || e.idx.count(id) != 1 {
		t.Fatalf("tiers mixed: %v", e.idx.held)
	}
	// Three copies in one event and the next: three removals to unindex.
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:1]})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1), stored(eh, toks, 4, 0, 1))
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	for i := 0; i < 3; i++ {
		if !e.idx.has(id, blockkeys.Key(eh[0])) {
			t.Fatalf("unindexed after %d of 3 removals", i)
		}
		e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:1]})
	}
	if e.idx.count(id) != 0 {
		t.Fatalf("three copies removed but block held: %v", e.idx.held)
	}
}

// With an index that reports what a pod already held, the copy table holds
// only blocks stored more than once: none for a pod whose blocks were each
// stored once, and an entry leaves once its block is down to one copy. (A
// table of every block was a memory miss per stored and removed block.)
func TestApplierCopyTableOnlyHoldsRestoredBlocks(t *testing.T) {
	e := newApplierEnvHeld(t, cborSeed0, true)
	toks := seq(1, 100*4)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 100))
	pod := e.a.pods[podKey{"p", 0}]
	if pod.copies != nil {
		t.Fatalf("a table for blocks stored once: %d entries", tableEntries(pod.copies))
	}
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 3)) // blocks 0-2 again
	if n := tableEntries(pod.copies); n != 3 {
		t.Fatalf("%d table entries after 3 blocks were stored again, want 3", n)
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:3]})
	if n := tableEntries(pod.copies); n != 0 {
		t.Fatalf("%d table entries once every block is down to one copy, want 0", n)
	}
	id := e.podID("p", 0)
	if e.idx.count(id) != 100 {
		t.Fatalf("index holds %d blocks, want 100", e.idx.count(id))
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh})
	if e.idx.count(id) != 0 {
		t.Fatalf("index holds %d blocks after all were removed", e.idx.count(id))
	}
	if p := e.pod("p", 0); p.CopiesKept != 3 || p.BlocksStored != 100 || p.BlocksRemoved != 100 {
		t.Fatalf("copies kept %d, stored %d, removed %d; want 3, 100, 100", p.CopiesKept, p.BlocksStored, p.BlocksRemoved)
	}
}

func tableEntries(t *countTable) int {
	if t == nil {
		return 0
	}
	n := 0
	for i := range t.sets {
		n += bits.OnesCount8(uint8(t.sets[i].Valid))
	}
	return n
}

// remaining_copy_counts is the engine's own count: it wins, and a removal
// with 0 left removes even a block we saw stored twice.
func TestApplierRemainingCopyCounts(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2), stored(eh, toks, 4, 0, 2))
	id := e.podID("p", 0)
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh, RemainingCopies: []uint32{1, 0}, HasRemainingCopies: true})
	if !e.idx.has(id, blockkeys.Key(eh[0])) || e.idx.has(id, blockkeys.Key(eh[1])) {
		t.Fatalf("remaining counts not honoured: %v", e.idx.held)
	}
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:1], RemainingCopies: []uint32{0}, HasRemainingCopies: true})
	if e.idx.count(id) != 0 {
		t.Fatal("count 0 must remove")
	}
	e.a.mu.RLock()
	pod := e.a.pods[podKey{"p", 0}]
	e.a.mu.RUnlock()
	if pod.copies != nil || !pod.copiesAuthority {
		t.Fatal("own copy table kept although the engine counts")
	}
}

// Hybrid model: group 0 full attention, group 1 sliding window. Sliding
// window removals do not shorten the match; a block evicted by the
// full-attention group no longer scores even while the sliding group holds it.
func TestApplierHybridGroups(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 12)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	full := stored(eh, toks, 4, 0, 3)
	full.GroupKind = event.GroupFullAttention
	swa := stored(eh, toks, 4, 0, 3)
	swa.GroupIdx, swa.GroupKind, swa.SlidingWindow = 1, event.GroupSlidingWindow, 4
	e.apply("h", 0, blockkeys.EngineVLLM, full, swa)
	id := e.podID("h", 0)
	if e.idx.count(id) != 3 {
		t.Fatalf("stored: %v", e.idx.held)
	}
	// The sliding window drops blocks 0 and 1: still a full prefix.
	e.apply("h", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[:2], GroupIdx: 1})
	if e.idx.count(id) != 3 {
		t.Fatal("sliding-window removal shortened the match")
	}
	// The full-attention group evicts block 1: the match ends at block 0.
	e.apply("h", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[1:2], GroupIdx: 0})
	m, _ := e.in.LookupModel(testModel)
	var got []int
	_ = e.idx.Lookup(t.Context(), m, []blockkeys.Key{blockkeys.Key(eh[0]), blockkeys.Key(eh[1]), blockkeys.Key(eh[2])}, visitFunc(func(i int, _ blockkeys.Key, hs []kvindex.Holder) bool {
		got = append(got, i)
		return true
	}))
	if len(got) != 1 {
		t.Fatalf("evicted full-attention block still matches: keys held at %v", got)
	}
	if p := e.pod("h", 0); p.GroupSkippedBlocks != 5 || p.FullAttentionGroups != 1 {
		t.Fatalf("stats %+v", p)
	}
}

type visitFunc func(i int, k blockkeys.Key, hs []kvindex.Holder) bool

func (f visitFunc) Visit(i int, k blockkeys.Key, hs []kvindex.Holder) bool { return f(i, k, hs) }

// Two full-attention groups (e.g. layers of different head sizes): a block
// is indexed once both hold it and unindexed when either drops it.
func TestApplierTwoFullAttentionGroups(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	g0 := stored(eh, toks, 4, 0, 2)
	g0.GroupKind = event.GroupFullAttention
	g1 := g0
	g1.GroupIdx = 1
	e.apply("f", 0, blockkeys.EngineVLLM, g0)
	id := e.podID("f", 0)
	if e.idx.count(id) != 2 { // only one full group known so far
		t.Fatalf("first group: %v", e.idx.held)
	}
	e.apply("f", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared})
	e.apply("f", 0, blockkeys.EngineVLLM, g1)
	if e.idx.count(id) != 0 {
		t.Fatal("indexed before every full-attention group held it")
	}
	e.apply("f", 0, blockkeys.EngineVLLM, g0)
	if e.idx.count(id) != 2 {
		t.Fatalf("both groups hold it: %v", e.idx.held)
	}
	e.apply("f", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[1:], GroupIdx: 1})
	if e.idx.has(id, blockkeys.Key(eh[1])) || !e.idx.has(id, blockkeys.Key(eh[0])) {
		t.Fatalf("one group dropped block 1: %v", e.idx.held)
	}
	if p := e.pod("f", 0); p.FullAttentionGroups != 2 {
		t.Fatalf("stats %+v", p)
	}
}

// locality REMOTE: held for the pod elsewhere, not its own cache.
func TestApplierRemoteNotIndexed(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	ev := stored(eh, toks, 4, 0, 2)
	ev.Remote = true
	e.apply("r", 0, blockkeys.EngineVLLM, ev)
	if e.idx.count(e.podID("r", 0)) != 0 || e.pod("r", 0).RemoteBlocks != 2 {
		t.Fatal("remote blocks indexed as the pod's")
	}
	if e.metric("kvindexd_blocks_not_indexed_total") != 2 {
		t.Fatal("metric")
	}
}

// Typed extra keys hash exactly as the values vLLM hashed; keys that cannot
// be reproduced still index the block, under the engine's hash, counted.
func TestApplierTypedAndOpaqueExtraKeys(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	x := blockkeys.RequestExtras{LoraName: "sql-lora"}
	eh := engineKeys(t, cborSeed0, toks, x)
	ev := stored(eh, toks, 4, 0, 2)
	ev.ExtraKeys = [][]any{{"sql-lora"}, {"sql-lora"}} // what the decoder makes of {"type": "lora", ...}
	e.apply("x", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("x", 0); p.ParityMatches != 2 {
		t.Fatalf("typed LoRA key: %+v", p)
	}
	other := engineKeys(t, cborSeed0, seq(50, 4), blockkeys.RequestExtras{})
	op := stored(other, seq(50, 4), 4, 0, 1)
	op.ExtraKeys = [][]any{{event.OpaqueExtraKey{What: "extra key future"}}}
	e.apply("x", 0, blockkeys.EngineVLLM, op)
	p := e.pod("x", 0)
	if p.ParityUnverified != 1 || p.UnverifiedReason != "extra_keys" || !e.idx.has(e.podID("x", 0), blockkeys.Key(other[0])) {
		t.Fatalf("opaque key: %+v", p)
	}
}

// A trailing partial page (SGLang) is unverified, and sets no block-size hint.
func TestApplierPartialPageNoHint(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	e.apply("s", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockStored, BlockHashes: []uint64{7}, TokenIDs: seq(1, 3), BlockSize: 3})
	p := e.pod("s", 0)
	if p.ParityHint != "" || p.ParityUnverified != 1 || p.UnverifiedReason != "partial_block" {
		t.Fatalf("partial page: %+v", p)
	}
	// Whole blocks of another size do name the block size.
	e.apply("s", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockStored, BlockHashes: []uint64{8, 9}, TokenIDs: seq(1, 6), BlockSize: 3})
	if p := e.pod("s", 0); p.ParityHint == "" {
		t.Fatal("no block-size hint for whole blocks of another size")
	}
}

func TestCountTableBounded(t *testing.T) {
	ct := newCountTable(64, nil)
	evicted := 0
	for i := uint64(0); i < 1000; i++ {
		v := uint16(1)
		if i%7 == 0 {
			v = 3
		}
		if ct.put(i*0x9E3779B97F4A7C15, v) {
			evicted++
		}
	}
	if len(ct.sets)*setassoc.Ways != 64 || evicted != 1000-64 {
		t.Fatalf("sets %d evicted %d", len(ct.sets), evicted)
	}
	// Entries with count 1 go first: most multi-copy entries survive.
	multi := 0
	for s := range ct.sets {
		for w := 0; w < setassoc.Ways; w++ {
			if ct.sets[s].vals[w] == 3 {
				multi++
			}
		}
	}
	if multi < 16 {
		t.Fatalf("only %d multi-copy entries kept", multi)
	}
	ct.put(5, 2)
	if v, ok := ct.get(5); !ok || v != 2 {
		t.Fatal("latest entry lost")
	}
	ct.del(5)
	if _, ok := ct.get(5); ok {
		t.Fatal("deleted entry found")
	}
}

// Issue 26 item 6: a table starts small and grows with its keys, keeping every
// entry and value, up to its cap; the gauge follows its memory.
func TestCountTableGrows(t *testing.T) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	ct := newCountTable(DefaultCopyTableSize, &tableBudget{limit: DefaultHoldTableBytes, gauge: g})
	if got := len(ct.sets) * setassoc.Ways; got != minCountTableEntries {
		t.Fatalf("new table has %d entries, want %d", got, minCountTableEntries)
	}
	const n = 1000
	for i := uint64(0); i < n; i++ {
		if ct.put(i*0x2545F4914F6CDD1D+7, uint16(i%5+1)) {
			t.Fatalf("entry %d evicted below the cap", i)
		}
	}
	for i := uint64(0); i < n; i++ {
		if v, ok := ct.get(i*0x2545F4914F6CDD1D + 7); !ok || v != uint16(i%5+1) {
			t.Fatalf("entry %d after growth: %d %v", i, v, ok)
		}
	}
	sets := len(ct.sets)
	if sets*setassoc.Ways < n || sets*setassoc.Ways > 16*n {
		t.Fatalf("%d keys in %d sets: not sized by use", n, sets)
	}
	if got, want := testutil.ToFloat64(g), float64(int64(sets)*countSetBytes); got != want {
		t.Fatalf("gauge %v, want %v", got, want)
	}
	ct.release()
	if got := testutil.ToFloat64(g); got != 0 {
		t.Fatalf("gauge %v after release", got)
	}
}

// Past the budget of all tables a table stops growing and replaces entries:
// the budget bounds the tables' memory whatever the pods store.
func TestCountTableBudget(t *testing.T) {
	b := &tableBudget{limit: 16 * countSetBytes * 4, gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})}
	a, c := newCountTable(DefaultCopyTableSize, b), newCountTable(DefaultCopyTableSize, b)
	evicted := 0
	for i := uint64(0); i < 1000; i++ {
		for _, ct := range []*countTable{a, c} {
			if ct.put(i*0x2545F4914F6CDD1D+7, 1) {
				evicted++
			}
		}
	}
	if used := b.used.Load(); used > b.limit || used != int64(len(a.sets)+len(c.sets))*countSetBytes {
		t.Fatalf("tables hold %d bytes (%d + %d sets), budget %d", used, len(a.sets), len(c.sets), b.limit)
	}
	if evicted == 0 {
		t.Fatal("2,000 keys fit in a 3 KB budget without a replacement")
	}
	a.release() // the freed room lets the other table grow to the whole budget
	for i := uint64(0); i < 1000 && len(c.sets) < 64; i++ {
		c.put(i*0x9E3779B97F4A7C15+3, 1)
	}
	if len(c.sets) != 64 {
		t.Fatalf("after the other table was freed: %d sets, want 64", len(c.sets))
	}
}

// A pod that stores one batch of 200 blocks in two full-attention groups
// holds tables sized for 200 keys (the 2,000 such pods held 2.4 GB
// with tables allocated at their cap), and they are freed with the pod.
func TestHoldTablesSizedByUse(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 200*4)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	g0 := stored(eh, toks, 4, 0, 200)
	g0.GroupKind = event.GroupFullAttention
	g1 := g0
	g1.GroupIdx = 1
	e.apply("grp", 0, blockkeys.EngineVLLM, g0, g1)
	if n := e.idx.count(e.podID("grp", 0)); n != 200 {
		t.Fatalf("%d blocks indexed, want 200", n)
	}
	pod := e.a.pods[podKey{"grp", 0}]
	if pod.copies == nil || pod.masks == nil {
		t.Fatalf("expected both tables: copies %v masks %v", pod.copies != nil, pod.masks != nil)
	}
	limit := int64(64 << 10)
	got := int64(len(pod.copies.sets)+len(pod.masks.sets)) * countSetBytes
	if got > limit {
		t.Fatalf("tables of a 200-block pod take %d bytes, want at most %d", got, limit)
	}
	if g := int64(testutil.ToFloat64(e.a.m.holdTableBytes)); g != got {
		t.Fatalf("kvindexd_hold_table_bytes %d, want %d", g, got)
	}
	e.a.ForgetPod(context.Background(), "grp", 0)
	if g := testutil.ToFloat64(e.a.m.holdTableBytes); g != 0 {
		t.Fatalf("kvindexd_hold_table_bytes %v after the pod was forgotten", g)
	}
}

// A snapshot replaces the pod's state: blocks it does not list go (a lost
// removal is repaired), listed SGLang hashes are indexed as the keys they
// are, hashes never seen stored too (they score by token ids: the request
// path computes SGLang's hashes).
func TestApplierSnapshotReplacesState(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 12)
	sg := sglangKeys(t, toks, 4)
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockStored, BlockHashes: u64s(sg), TokenIDs: toks, BlockSize: 4})
	id := e.podID("s", 0)
	if e.idx.count(id) != 3 {
		t.Fatalf("stored: %v", e.idx.held)
	}
	// The engine dropped block 1 (removal lost) and stored one we never saw.
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockSnapshot, BlockHashes: []uint64{uint64(sg[0]), uint64(sg[2]), 77}})
	if e.idx.count(id) != 3 || !e.idx.has(id, sg[0]) || !e.idx.has(id, sg[2]) || e.idx.has(id, sg[1]) || !e.idx.has(id, 77) {
		t.Fatalf("after snapshot: %v", e.idx.held)
	}
	p := e.pod("s", 0)
	if p.Snapshots != 1 || p.Clears != 0 {
		t.Fatalf("stats %+v", p)
	}
	if e.metric("kvindexd_blocks_unkeyed_total") != 0 {
		t.Fatal("a snapshot hash went unkeyed")
	}
	e.apply("s", 0, blockkeys.EngineSGLang, event.Event{Kind: event.BlockRemoved, BlockHashes: []uint64{uint64(sg[0])}})
	if e.idx.has(id, sg[0]) {
		t.Fatal("removal after the snapshot")
	}
}

// sglangKeys are SGLang's page hashes of toks (HasherSet.ForEngine, proven
// against hashlib by TestEngineHashVectors).
func sglangKeys(t *testing.T, toks []uint32, bs int) []blockkeys.Key {
	t.Helper()
	set, err := blockkeys.NewHasherSet(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, BlockSize: bs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set.ForEngine("", blockkeys.EngineSGLang).Keys(nil, toks, blockkeys.RequestExtras{})
}

func u64s(ks []blockkeys.Key) []uint64 {
	out := make([]uint64, len(ks))
	for i, k := range ks {
		out[i] = uint64(k)
	}
	return out
}
