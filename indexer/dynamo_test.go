package indexer

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// TestDynamoHashesMatchReference checks AppendDynamoHashes against vectors
// computed with an XXH3 we did not write: npm hash-wasm 4.13.0, by
// hack/dynamo-xxh3/gen-vectors.mjs (which says what Dynamo hashes: seed
// 1337, plus xxh3(lora_name) for an adapter; little-endian u32 tokens; full
// blocks only), written to testdata/dynamo_local_hashes.json.
func TestDynamoHashesMatchReference(t *testing.T) {
	raw, err := os.ReadFile("testdata/dynamo_local_hashes.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Reference string `json:"reference"`
		Cases     []struct {
			Tokens    []uint32 `json:"tokens"`
			BlockSize int      `json:"block_size"`
			Lora      string   `json:"lora_name"`
			Hashes    []string `json:"local_hashes"`
			HashesI64 []string `json:"local_hashes_i64"`
		} `json:"dynamo_local_hashes"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Reference, "hash-wasm") || len(f.Cases) < 6 {
		t.Fatalf("unexpected vector file: %q, %d cases", f.Reference, len(f.Cases))
	}
	var buf []byte
	for i, c := range f.Cases {
		var got []uint64
		got, buf = AppendDynamoHashes(nil, buf, c.Tokens, c.BlockSize, DynamoLoraSeed(c.Lora))
		if len(got) != len(c.Hashes) {
			t.Fatalf("case %d: %d hashes, want %d", i, len(got), len(c.Hashes))
		}
		for j, h := range got {
			want, _ := strconv.ParseUint(c.Hashes[j], 10, 64)
			wantI, _ := strconv.ParseInt(c.HashesI64[j], 10, 64)
			if h != want || int64(h) != wantI {
				t.Errorf("case %d block %d: %d, want %d (i64 %d)", i, j, h, want, wantI)
			}
		}
	}
}

func dynLocals(tokens []uint32, lora string) []uint64 {
	out, _ := AppendDynamoHashes(nil, nil, tokens, testBlock, DynamoLoraSeed(lora))
	return out
}

func dynSummary(r *DynamoResult) string {
	var b strings.Builder
	for _, rk := range r.Ranks {
		fmt.Fprintf(&b, "%s/%d:%d ", rk.Pod, rk.DPRank, rk.Blocks)
	}
	fmt.Fprintf(&b, "freq=%v", r.Frequencies)
	return b.String()
}

// TestDynamoScoreWalksLocalHashes: the Dynamo hashes of a prompt reach the
// blocks the engines stored (chained through their parents, across events),
// only GPU blocks count, a sequence stops at its first unknown hash, and a
// token query hashed the Dynamo way gives the same answer.
func TestDynamoScoreWalksLocalHashes(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(100, 6*testBlock)
	hs := blockHashes(prompt, blockkeys.RequestExtras{})
	// Before a Dynamo registration the table stays empty: hashes match
	// nothing (tokens still do), and the dump has no events.
	apply(ix, "7", 0, storeEvent(prompt, 1, event.TierGPU))
	var before DynamoResult
	if err := ix.DynamoScore(context.Background(), testModel, dynLocals(prompt, ""), nil, "", &before); err != nil || dynSummary(&before) != "freq=[]" {
		t.Fatalf("by hash before EnableDynamoHashes: %s %v", dynSummary(&before), err)
	}
	if n := testutil.ToFloat64(ix.dyn.entries); n != 0 {
		t.Fatalf("%v entries before EnableDynamoHashes", n)
	}
	apply(ix, "7", 0, event.Event{Kind: event.BlockRemoved, BlockHashes: hs[:1]})
	ix.EnableDynamoHashes()
	// pod-a stores 4 blocks in two events (the second names its parent);
	// pod-b 6 blocks on CPU; pod-c 2 on GPU, rank 1.
	apply(ix, "7", 0, event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: prompt[:2*testBlock], BlockHashes: hs[:2]})
	apply(ix, "7", 0, event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: prompt[2*testBlock : 4*testBlock],
		BlockHashes: hs[2:4], ParentHash: hs[1], HasParent: true})
	apply(ix, "8", 0, storeEvent(prompt, 6, event.TierCPU))
	apply(ix, "9", 1, storeEvent(prompt, 2, event.TierGPU))

	locals := dynLocals(prompt, "")
	var r DynamoResult
	if err := ix.DynamoScore(context.Background(), testModel, locals, nil, "", &r); err != nil {
		t.Fatal(err)
	}
	if got, want := dynSummary(&r), "7/0:4 9/1:2 freq=[2 2 1 1]"; got != want {
		t.Errorf("by hash: %s, want %s", got, want)
	}
	if err := ix.DynamoScore(context.Background(), testModel, nil, prompt, "", &r); err != nil {
		t.Fatal(err)
	}
	if got, want := dynSummary(&r), "7/0:4 9/1:2 freq=[2 2 1 1]"; got != want {
		t.Errorf("by tokens: %s, want %s", got, want)
	}
	// A wrong second hash stops the walk after block 0; a lora seed is
	// another hash entirely; an unknown model answers nothing.
	bad := append([]uint64{locals[0], locals[1] ^ 1}, locals[2:]...)
	if err := ix.DynamoScore(context.Background(), testModel, bad, nil, "", &r); err != nil || dynSummary(&r) != "7/0:1 9/1:1 freq=[2]" {
		t.Errorf("broken chain: %s %v", dynSummary(&r), err)
	}
	if err := ix.DynamoScore(context.Background(), testModel, nil, prompt, "adapter", &r); err != nil || dynSummary(&r) != "freq=[]" {
		t.Errorf("lora: %s %v", dynSummary(&r), err)
	}
	if err := ix.DynamoScore(context.Background(), "other/model", locals, nil, "", &r); err != nil || dynSummary(&r) != "freq=[]" {
		t.Errorf("unknown model: %s %v", dynSummary(&r), err)
	}
	// Pod 7 drops block 1 and keeps 2 and 3: Dynamo's find_matches adds one
	// for every worker on each node it walks (pod 9 still holds node 1), so
	// pod 7 counts 3.
	apply(ix, "7", 0, event.Event{Kind: event.BlockRemoved, BlockHashes: hs[1:2]})
	if err := ix.DynamoScore(context.Background(), testModel, locals, nil, "", &r); err != nil || dynSummary(&r) != "7/0:3 9/1:2 freq=[2 1 1 1]" {
		t.Errorf("after removal: %s %v", dynSummary(&r), err)
	}

	// The dump: breadth first, one event per (block, GPU holder), parents
	// before children, pod 8's CPU blocks left out; pod 7's blocks 2 and 3
	// come under block 1, which only pod 9 holds now (as Dynamo's dump
	// names a node's parent whoever holds it).
	var lines []string
	err := ix.DynamoDump(context.Background(), func(model string, bs int, evs []DynamoDumpEvent) error {
		lines = append(lines, fmt.Sprintf("%s bs=%d", model, bs))
		for _, e := range evs {
			lines = append(lines, fmt.Sprintf("%s/%d root=%v parent=%v block=%v local=%v", e.Pod, e.DPRank, e.Root, parentOK(hs, e), indexOf(hs, e.BlockHash), indexOf(locals, e.Local)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{"test/model bs=4", "7/0 root=true parent=true block=0 local=0", "9/1 root=true parent=true block=0 local=0",
		"9/1 root=false parent=true block=1 local=1", "7/0 root=false parent=true block=3 local=3"} {
		if !strings.Contains(got, want) {
			t.Errorf("dump lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "8/0") || len(lines) != 6 || strings.Index(got, "block=1") > strings.Index(got, "block=2") {
		t.Errorf("dump has CPU blocks, or a child before its parent:\n%s", got)
	}
}

func parentOK(hs []uint64, e DynamoDumpEvent) bool {
	i := indexOf(hs, e.BlockHash)
	if e.Root {
		return i == 0
	}
	return i > 0 && e.Parent == hs[i-1]
}

func indexOf(s []uint64, v uint64) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestDynamoTableCapped: the table holds at most its capacity; when full,
// entries whose block no pod holds are swept, and what still finds no room
// is refused and counted.
func TestDynamoTableCapped(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{DynamoHashCapacity: 8, Registry: reg})
	ix.EnableDynamoHashes()
	a, b := seqTokens(1000, 8*testBlock), seqTokens(5000, 8*testBlock)
	apply(ix, "7", 0, storeEvent(a, 8, event.TierGPU))
	if n := testutil.ToFloat64(ix.dyn.entries); n != 8 {
		t.Fatalf("entries %v, want 8", n)
	}
	apply(ix, "7", 0, storeEvent(b, 2, event.TierGPU))
	if got := testutil.ToFloat64(ix.dyn.refusedC); got != 2 {
		t.Errorf("refused %v, want 2 (the table is full of held blocks)", got)
	}
	// Pod 7 drops a: the next store sweeps a's 8 entries out and fits.
	apply(ix, "7", 0, event.Event{Kind: event.BlockRemoved, BlockHashes: blockHashes(a, blockkeys.RequestExtras{})})
	ix.dyn.refused = ix.dyn.cap / 4 // past the amortization guard
	apply(ix, "7", 0, storeEvent(b, 8, event.TierGPU))
	if n, s := testutil.ToFloat64(ix.dyn.entries), testutil.ToFloat64(ix.dyn.sweptC); n != 8 || s != 8 {
		t.Errorf("entries %v swept %v, want 8 and 8", n, s)
	}
	var r DynamoResult
	if err := ix.DynamoScore(context.Background(), testModel, dynLocals(b, ""), nil, "", &r); err != nil || dynSummary(&r) != "7/0:8 freq=[1 1 1 1 1 1 1 1]" {
		t.Errorf("after the sweep: %s %v", dynSummary(&r), err)
	}
}

// TestDynamoObserveAllocatesNothing: translating a stored block on the
// apply path allocates nothing once the table and its buffers have grown.
func TestDynamoObserveAllocatesNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	tab, err := newDynTable(1<<10, prometheus.NewRegistry(), func(kvindex.ModelID, blockkeys.Key) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(7, 16*testBlock)
	evs := []event.Event{storeEvent(prompt, 16, event.TierGPU)}
	tab.observe(1, testBlock, evs)
	if n := testing.AllocsPerRun(100, func() { tab.observe(1, testBlock, evs) }); n != 0 {
		t.Errorf("%v allocations per batch of 16 blocks", n)
	}
}
