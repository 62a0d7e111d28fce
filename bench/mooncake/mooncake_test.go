package mooncake

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/kvindex/kvindex/sim"
)

func tinyTrace(t *testing.T) []sim.Request {
	t.Helper()
	trace, err := sim.ReadTraceFile("../../sim/testdata/mooncake/synthetic_trace.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	return trace
}

// tinyConfig evicts: 8 workers of 256 blocks against a few hundred
// requests of ~30 blocks, doubled in length and copied twice.
func tinyConfig(tokens bool) Config {
	cfg := DefaultConfig()
	cfg.Shape = Shape{Workers: 8, LengthFactor: 2, DupFactor: 2, Seed: 42, MaxRequests: 300}
	cfg.Capacity = 256
	cfg.Tokens = tokens
	return cfg
}

func TestEnginePrefixClosedLRU(t *testing.T) {
	e := NewEngine(4)
	var st Step
	e.Run([]uint64{1, 2, 3}, &st)
	if len(st.Runs) != 1 || st.Runs[0] != (Run{0, 3}) || len(st.Evicted) != 0 {
		t.Fatalf("first request: %+v", st)
	}
	e.Run([]uint64{1, 2, 4, 5}, &st) // needs 2 new blocks, 1 free: evicts the leaf 3, not its parents
	if len(st.Evicted) != 1 || st.Evicted[0] != 3 || len(st.Runs) != 1 || st.Runs[0] != (Run{2, 4}) {
		t.Fatalf("second request: %+v", st)
	}
	e.Run([]uint64{6}, &st) // the least recent is now the leaf 5
	if len(st.Evicted) != 1 || st.Evicted[0] != 5 || e.Resident() != 4 || !e.Holds(1) || !e.Holds(2) || !e.Holds(4) {
		t.Fatalf("third request: %+v, resident %d", st, e.Resident())
	}
}

// TestReplayCountsAgree runs a tiny open-loop replay with each query input
// and checks that what the index holds is exactly what the mock engines
// hold, that every operation completed and that queries found blocks.
func TestReplayCountsAgree(t *testing.T) {
	trace := tinyTrace(t)
	for _, v := range []struct{ tokens, copies bool }{{false, false}, {true, false}, {false, true}} {
		tokens := v.tokens
		cfg := tinyConfig(tokens)
		cfg.CopyCounts = v.copies
		c, err := Build(trace, cfg)
		if err != nil {
			t.Fatal(err)
		}
		tot := c.Totals
		if tot.Requests != 600 || tot.RemovedBlocks == 0 || tot.StoredEvents == 0 {
			t.Fatalf("tokens=%v: corpus does not evict or is not the trace: %+v", tokens, tot)
		}
		resident := int64(0)
		for _, n := range c.Resident {
			resident += int64(n)
		}
		if tot.StoredBlocks-tot.RemovedBlocks != resident {
			t.Fatalf("tokens=%v: stored %d - removed %d != resident %d", tokens, tot.StoredBlocks, tot.RemovedBlocks, resident)
		}
		r, err := Replay(context.Background(), c, RunConfig{Window: 200 * time.Millisecond, EventWorkers: 2, QueryLanes: 4})
		if err != nil {
			t.Fatal(err)
		}
		// Whether it kept up depends on the machine; what it applied does not.
		if r.DecodeErrors != 0 {
			t.Fatalf("tokens=%v: %d decode errors", tokens, r.DecodeErrors)
		}
		if r.IndexEntries != resident {
			t.Errorf("tokens=%v: index holds %d entries, the engines %d blocks", tokens, r.IndexEntries, resident)
		}
		for w, n := range c.Resident {
			if r.PodEntries[w] != int64(n) {
				t.Errorf("tokens=%v: worker %d: index %d, engine %d", tokens, w, r.PodEntries[w], n)
			}
		}
		if r.QueriesMatched == 0 {
			t.Errorf("tokens=%v: none of %d queries matched", tokens, tot.Requests)
		}
		if r.Service.P50 <= 0 || r.Elapsed <= 0 {
			t.Errorf("tokens=%v: no timings: %+v", tokens, r)
		}
		// The fixed-work mode applies the same events, in one goroutine.
		a, err := ApplyAll(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if a.DecodeErrors != 0 || a.Batches != tot.Batches || a.Blocks != tot.StoredBlocks+tot.RemovedBlocks {
			t.Errorf("tokens=%v: ApplyAll applied %d messages, %d blocks (%d decode errors); the corpus has %d, %d",
				tokens, a.Batches, a.Blocks, a.DecodeErrors, tot.Batches, tot.StoredBlocks+tot.RemovedBlocks)
		}
		for w, n := range c.Resident {
			if a.PodEntries[w] != int64(n) {
				t.Errorf("tokens=%v: ApplyAll: worker %d: index %d, engine %d", tokens, w, a.PodEntries[w], n)
			}
		}
	}
}

// TestPartitionFactors pins mooncake_bench's trace transforms: the length
// factor turns hash id h into h*f .. h*f+f-1 (shared prefixes stay shared,
// f times longer), the duplication factor adds copies whose ids are offset
// by the expanded id space, disjoint from the original.
func TestPartitionFactors(t *testing.T) {
	trace := []sim.Request{{Timestamp: 0, HashIDs: []uint64{0, 1, 2}}, {Timestamp: 1, HashIDs: []uint64{0, 1, 3, 4}}}
	w, err := Partition(trace, Shape{Workers: 1, LengthFactor: 2, DupFactor: 2, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	var got [][]uint64
	for _, r := range w[0] {
		got = append(got, r.HashIDs)
	}
	want := [][]uint64{{0, 1, 2, 3, 4, 5}, {10, 11, 12, 13, 14, 15}, {0, 1, 2, 3, 6, 7, 8, 9}, {10, 11, 12, 13, 16, 17, 18, 19}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	w, err = Partition(trace, Shape{Workers: 4, LengthFactor: 1, DupFactor: 8, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, reqs := range w {
		for i := 1; i < len(reqs); i++ {
			if reqs[i].Timestamp < reqs[i-1].Timestamp {
				t.Fatalf("a worker's requests are not in time order")
			}
		}
		n += len(reqs)
	}
	if n != 16 {
		t.Fatalf("%d requests dealt, want 16", n)
	}
}
