package sim

import (
	"math"
	"testing"
)

func testEngine(t *testing.T, blocks, blockSize, maxSeqs, budget int) *engine {
	t.Helper()
	e, err := newEngine(engineConfig{KVBlocks: blocks, BlockSize: blockSize, MaxNumSeqs: maxSeqs, MaxNumBatchedTokens: budget,
		PrefillTokensPerS: 1000, DecodeITL: 0.01, DecodePerSeq: 0.001, DecodePerKVToken: 0.0001})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// checkPool verifies the block accounting: references equal the blocks the
// running sequences hold, the free queue holds exactly the unreferenced
// blocks, and nothing exceeds the capacity.
func checkPool(t *testing.T, e *engine) {
	t.Helper()
	p := e.pool
	refs := make([]int32, p.n)
	for _, s := range e.running {
		for _, b := range s.blocks {
			refs[b]++
		}
	}
	for _, s := range e.waiting {
		if len(s.blocks) != 0 || s.computed != 0 {
			t.Fatalf("waiting request %d holds %d blocks, computed %d", s.req, len(s.blocks), s.computed)
		}
	}
	free := 0
	for b := 0; b < p.n; b++ {
		if refs[b] != p.ref[b] {
			t.Fatalf("block %d: ref %d, running sequences hold it %d times", b, p.ref[b], refs[b])
		}
		if p.ref[b] == 0 {
			free++
		}
	}
	inQueue := 0
	for b := p.next[p.n]; b != int32(p.n); b = p.next[b] {
		if p.ref[b] != 0 {
			t.Fatalf("referenced block %d is in the free queue", b)
		}
		inQueue++
	}
	if free != p.nFree || inQueue != p.nFree || p.used() > p.n || p.used() < 0 {
		t.Fatalf("free %d, queue %d, nFree %d, used %d of %d", free, inQueue, p.nFree, p.used(), p.n)
	}
	for h, b := range p.byHash {
		if !p.cached[b] || p.hash[b] != h {
			t.Fatalf("hash map entry %x -> block %d is stale", h, b)
		}
	}
}

// runEngine steps e to completion (at most maxSteps), checking the pool
// after every step, and returns the progress records and the finish time.
func runEngine(t *testing.T, e *engine, maxSteps int) ([]seqProgress, []float64) {
	t.Helper()
	var all []seqProgress
	var at []float64
	now := 0.0
	for i := 0; i < maxSteps; i++ {
		dur, ok := e.startStep()
		if !ok {
			return all, at
		}
		checkPool(t, e)
		now += dur
		n := len(all)
		all = e.finishStep(all)
		for range all[n:] {
			at = append(at, now)
		}
		checkPool(t, e)
	}
	t.Fatalf("engine did not drain in %d steps", maxSteps)
	return nil, nil
}

func TestEngineChunkedPrefillTimingByHand(t *testing.T) {
	// 100-token prompt, 3 output tokens, 16-token blocks, 64-token budget:
	// step 1 prefills 64 (0.01 + 64/1000), step 2 the remaining 36 and
	// samples the first token (0.01 + 0.036), then two decode steps of one
	// sequence attending over 101 and 102 tokens.
	e := testEngine(t, 100, 16, 8, 64)
	if err := e.add(0, 100, 3, nil, 7); err != nil {
		t.Fatal(err)
	}
	prog, at := runEngine(t, e, 100)
	want := []float64{0.074 + 0.046, 0.074 + 0.046 + 0.01 + 0.001 + 0.0101, 0.074 + 0.046 + 0.0211 + 0.01 + 0.001 + 0.0102}
	if len(prog) != 3 || !prog[0].FirstToken || !prog[2].Finished {
		t.Fatalf("progress %+v", prog)
	}
	for i := range want {
		if math.Abs(at[i]-want[i]) > 1e-12 {
			t.Errorf("token %d at %.6f, want %.6f", i+1, at[i], want[i])
		}
	}
	if st := e.statsNow(); st.PrefillTokens != 100 || st.DecodeTokens != 2 || st.GeneratedToken != 3 || st.Steps != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestEngineDecodeStepGrowsWithBatch(t *testing.T) {
	c := engineConfig{DecodeITL: 0.011, DecodePerSeq: 55e-6, DecodePerKVToken: 39e-9, PrefillTokensPerS: 16000}
	one, many := c.stepTime(0, 1, 7200), c.stepTime(0, 64, 64*7200)
	if !(many > one) || math.Abs(many-(0.011+64*55e-6+64*7200*39e-9)) > 1e-12 {
		t.Errorf("step of 1 seq %.4f s, of 64 seqs %.4f s", one, many)
	}
}

func TestEnginePrefixCacheKeepsFreedBlocksLRU(t *testing.T) {
	// 8 blocks of 4 tokens. Request A (prompt blocks a0 a1) finishes; its
	// blocks stay cached while free. B with the same prompt hits both (the
	// hit is capped to leave one token to compute: 8-token prompt -> 1 block).
	e := testEngine(t, 8, 4, 8, 64)
	pa := []uint64{101, 102}
	if err := e.add(0, 8, 1, pa, 1); err != nil {
		t.Fatal(err)
	}
	runEngine(t, e, 10)
	if e.cachedBlocks() != 2 || e.usedBlocks() != 0 {
		t.Fatalf("after A: cached %d used %d", e.cachedBlocks(), e.usedBlocks())
	}
	if err := e.add(1, 9, 1, pa, 2); err != nil {
		t.Fatal(err)
	}
	runEngine(t, e, 10)
	if st := e.statsNow(); st.HitTokens != 8 || st.PromptTokens != 17 {
		t.Fatalf("hit %d of %d prompt tokens, want 8 of 17", st.HitTokens, st.PromptTokens)
	}
	// A fully cached prompt still computes its last token: an 8-token
	// prompt whose two blocks are cached reuses only the first.
	if err := e.add(3, 8, 1, pa, 4); err != nil {
		t.Fatal(err)
	}
	runEngine(t, e, 10)
	if st := e.statsNow(); st.HitTokens != 12 || st.PromptTokens != 25 {
		t.Fatalf("hit %d of %d prompt tokens, want 12 of 25", st.HitTokens, st.PromptTokens)
	}
	// A finished request's blocks are freed tail first, so its tail block
	// is evicted before its head. The free queue now holds the 5 never used
	// blocks, then B's unshared last block, a1, a0: a 7-block request takes
	// all but a0.
	ops := e.takeKVEvents()
	if len(ops) == 0 || ops[0].Removed {
		t.Fatalf("first events %+v, want BlockStored", ops)
	}
	if err := e.add(2, 4*7, 1, []uint64{201, 202, 203, 204, 205, 206, 207}, 3); err != nil {
		t.Fatal(err)
	}
	runEngine(t, e, 10)
	_, headKept := e.pool.byHash[101]
	_, tailKept := e.pool.byHash[102]
	if !headKept || tailKept {
		t.Errorf("after pressure: head a0 cached %v (want true), tail a1 cached %v (want false)", headKept, tailKept)
	}
	var removed []uint64
	for _, op := range e.takeKVEvents() {
		if op.Removed {
			removed = append(removed, op.Blocks...)
		}
	}
	if len(removed) == 0 {
		t.Fatal("no BlockRemoved event for the evicted blocks")
	}
}

func TestEngineFIFOAdmissionNoOvertaking(t *testing.T) {
	// 10 blocks of 4 tokens. C runs holding 8 blocks; A (needs 3 blocks)
	// cannot be admitted, and B (needs 1) behind it must not overtake it.
	e := testEngine(t, 10, 4, 8, 64)
	if err := e.add(0, 32, 5, nil, 1); err != nil { // C: 8 blocks for the prompt
		t.Fatal(err)
	}
	if _, ok := e.startStep(); !ok {
		t.Fatal("C not scheduled")
	}
	e.finishStep(nil)
	if err := e.add(1, 12, 1, nil, 2); err != nil { // A
		t.Fatal(err)
	}
	if err := e.add(2, 3, 1, nil, 3); err != nil { // B
		t.Fatal(err)
	}
	if _, ok := e.startStep(); !ok {
		t.Fatal("C's decode not scheduled")
	}
	checkPool(t, e)
	if e.numRunning() != 1 || e.numWaiting() != 2 || e.waiting[0].req != 1 || e.waiting[1].req != 2 {
		t.Fatalf("running %d, waiting %d (head %d): B overtook A or A was admitted", e.numRunning(), e.numWaiting(), e.waiting[0].req)
	}
	e.finishStep(nil)
	prog, _ := runEngine(t, e, 100)
	order := []int{}
	for _, p := range prog {
		if p.FirstToken {
			order = append(order, p.Req)
		}
	}
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Errorf("first tokens in order %v, want A (1) before B (2)", order)
	}
}

func TestEnginePreemptsMostRecentAndRecomputes(t *testing.T) {
	// 6 blocks of 4 tokens, two requests with 8-token prompts (2 blocks
	// each) and 10 output tokens each (ends at 17 tokens: 5 blocks). Both
	// are admitted; decoding soon needs more blocks than exist, so the most
	// recently admitted (request 1) is preempted, requeued at the front and
	// recomputed later. Both must finish with all their tokens.
	// A third request waits (max_num_seqs 2): the preempted one must go
	// back in front of it.
	e := testEngine(t, 6, 4, 2, 64)
	for i := 0; i < 3; i++ {
		if err := e.add(i, 8, 10, nil, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	var prog []seqProgress
	for e.statsNow().Preemptions == 0 {
		if _, ok := e.startStep(); !ok {
			t.Fatal("drained without preempting")
		}
		if e.statsNow().Preemptions > 0 && (len(e.waiting) != 2 || e.waiting[0].req != 1 || e.waiting[1].req != 2) {
			t.Fatalf("after preemption the queue is %v, want request 1 in front of 2", []int{e.waiting[0].req, e.waiting[len(e.waiting)-1].req})
		}
		prog = e.finishStep(prog)
	}
	rest, _ := runEngine(t, e, 1000)
	prog = append(prog, rest...)
	st := e.statsNow()
	if st.Preemptions == 0 || st.RecomputeToks == 0 {
		t.Fatalf("no preemption: %+v", st)
	}
	gen := map[int]int{}
	finished := map[int]int{}
	for _, p := range prog {
		gen[p.Req]++
		if p.Finished {
			finished[p.Req]++
			if p.Req == 1 && p.Preemptions == 0 {
				t.Errorf("request 1 (admitted last) was not the one preempted")
			}
			if p.Req == 0 && p.Preemptions != 0 {
				t.Errorf("request 0 (admitted first) was preempted")
			}
		}
	}
	for i := 0; i < 3; i++ {
		if gen[i] != 10 || finished[i] != 1 {
			t.Errorf("request %d: %d tokens, finished %d times; want 10 and 1", i, gen[i], finished[i])
		}
	}
	if e.usedBlocks() != 0 || e.numRunning() != 0 || e.numWaiting() != 0 {
		t.Errorf("engine not drained: used %d running %d waiting %d", e.usedBlocks(), e.numRunning(), e.numWaiting())
	}
}

func TestEngineMaxNumSeqs(t *testing.T) {
	e := testEngine(t, 100, 4, 2, 1000)
	for i := 0; i < 5; i++ {
		if err := e.add(i, 4, 3, nil, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	e.startStep()
	if e.numRunning() != 2 || e.numWaiting() != 3 {
		t.Fatalf("running %d waiting %d, want 2 and 3", e.numRunning(), e.numWaiting())
	}
}

func TestEngineRejectsBadInput(t *testing.T) {
	if _, err := newEngine(engineConfig{KVBlocks: 0, BlockSize: 16, MaxNumSeqs: 1, MaxNumBatchedTokens: 1, PrefillTokensPerS: 1, DecodeITL: 1}); err == nil {
		t.Error("zero KV blocks accepted")
	}
	if _, err := newEngine(engineConfig{KVBlocks: 1, BlockSize: 16, MaxNumSeqs: 1, MaxNumBatchedTokens: 1, PrefillTokensPerS: math.NaN(), DecodeITL: 1}); err == nil {
		t.Error("NaN prefill rate accepted")
	}
	e := testEngine(t, 4, 4, 8, 64)
	if err := e.add(0, 20, 1, nil, 0); err == nil {
		t.Error("request larger than the KV cache accepted (it could never run)")
	}
	if err := e.add(0, 4, 0, nil, 0); err == nil {
		t.Error("zero output tokens accepted")
	}
	if err := e.add(0, 4, 1, []uint64{1, 2}, 0); err == nil {
		t.Error("more block hashes than full prompt blocks accepted")
	}
}

func TestEngineSharedKVReadOnceChargesSharedBlocksOnce(t *testing.T) {
	// share is SharedKVReadShare; -1 means SharedKVReadOnce off.
	mk := func(share float64) *engine {
		e, err := newEngine(engineConfig{KVBlocks: 20, BlockSize: 4, MaxNumSeqs: 8, MaxNumBatchedTokens: 64,
			PrefillTokensPerS: 1000, DecodeITL: 0.01, DecodePerSeq: 0.001, DecodePerKVToken: 0.0001,
			SharedKVReadOnce: share >= 0, SharedKVReadShare: max(share, 0)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	hashes := []uint64{11, 12}
	// Both decode in the third step. A: context 10 in blocks 0 (shared), 1,
	// 2; B: context 9 in blocks 0 (shared), 1', 2'. Every holder reading
	// every block: 10 + 9 = 19 tokens. Shared blocks once: block 0's 4 tokens
	// counted once, 15. A share s of the read for the second holder: 15 + 4s.
	for _, c := range []struct{ share, ctx float64 }{{-1, 19}, {0, 15}, {0.5, 17}, {1, 19}} {
		e := mk(c.share)
		step := func() float64 {
			dur, ok := e.startStep()
			if !ok {
				t.Fatal("no step")
			}
			e.finishStep(nil)
			checkPool(t, e)
			return dur
		}
		if err := e.add(0, 8, 5, hashes, 0); err != nil {
			t.Fatal(err)
		}
		step() // A's prefill: 8 tokens, first token sampled
		if err := e.add(1, 8, 5, hashes, 1); err != nil {
			t.Fatal(err)
		}
		step() // A decodes; B reuses block 0 (block 1 is recomputed) and prefills 4 tokens
		want := 0.01 + 2*0.001 + c.ctx*0.0001
		if got := step(); math.Abs(got-want) > 1e-12 {
			t.Errorf("share %v: decode step %.6f s, want %.6f", c.share, got, want)
		}
	}
}
