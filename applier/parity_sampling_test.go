package applier

import (
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// rootEvent is one request's first BlockStored: blocks of fresh tokens, no
// parent, hashed as an engine configured with cfg would.
func rootEvent(t *testing.T, cfg blockkeys.KeyConfig, n, blocks int) event.Event {
	toks := seq(1_000_000+n*blocks*cfg.BlockSize, blocks*cfg.BlockSize)
	return stored(engineKeys(t, cfg, toks, blockkeys.RequestExtras{}), toks, cfg.BlockSize, 0, blocks)
}

// proveParity applies matching events until the pod is sampled; it returns
// the next event number.
func proveParity(t *testing.T, e *applierEnv) int {
	t.Helper()
	n := 0
	for ; n*8 < ParityProofBlocks; n++ {
		e.apply("p", 0, blockkeys.EngineVLLM, rootEvent(t, e.cfg, n, 8))
	}
	if p := e.pod("p", 0); p.ParityMatches != ParityProofBlocks || p.ParitySampledOut != 0 {
		t.Fatalf("while proving every block is checked: %+v", p)
	}
	return n
}

func TestParitySamplingAfterProof(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	n := proveParity(t, e)
	var last event.Event
	for i := 0; i < 2*ParitySampleEvery; i++ {
		last = rootEvent(t, e.cfg, n+i, 8)
		e.apply("p", 0, blockkeys.EngineVLLM, last)
	}
	p := e.pod("p", 0)
	if p.ParityMatches != ParityProofBlocks+2*8 || p.ParitySampledOut != (2*ParitySampleEvery-2)*8 || p.BlocksStored != uint64(ParityProofBlocks+2*ParitySampleEvery*8) {
		t.Fatalf("want 1 event in %d checked: %+v", ParitySampleEvery, p)
	}
	if e.metric("kvindexd_parity_sampled_out_total") != float64(p.ParitySampledOut) {
		t.Fatal("sampled-out metric disagrees with the pod's stats")
	}
	for _, k := range last.BlockHashes { // sampled out and still indexed
		if !e.idx.has(e.podID("p", 0), blockkeys.Key(k)) {
			t.Fatalf("block %d not indexed", k)
		}
	}
}

// A mismatch caught by a sample puts the pod back to checking every block.
func TestParityMismatchAfterProofChecksFully(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	n := proveParity(t, e)
	for i := 0; i < ParitySampleEvery-1; i++ {
		e.apply("p", 0, blockkeys.EngineVLLM, rootEvent(t, e.cfg, n, 8))
		n++
	}
	salted := seq(7, 32)
	e.apply("p", 0, blockkeys.EngineVLLM, stored(engineKeys(t, e.cfg, salted, blockkeys.RequestExtras{CacheSalt: "x"}), salted, 4, 0, 8))
	before := e.pod("p", 0)
	if before.ParityMismatches != 8 {
		t.Fatalf("the due sample was not checked: %+v", before)
	}
	for i := 0; i < 3; i++ {
		e.apply("p", 0, blockkeys.EngineVLLM, rootEvent(t, e.cfg, n+i, 8))
	}
	if p := e.pod("p", 0); p.ParityMatches != before.ParityMatches+24 || p.ParitySampledOut != before.ParitySampledOut {
		t.Fatalf("after a mismatch every block must be checked again: before %+v after %+v", before, p)
	}
}

// AllBlocksCleared (an engine restart or a lost batch produces one) drops
// the proof: the engine may have come back with another configuration.
func TestParityClearChecksFully(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	n := proveParity(t, e)
	wrong := cborSeed0
	wrong.Seed = "7"
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared}, rootEvent(t, wrong, n, 8))
	if p := e.pod("p", 0); p.ParityMismatches != 8 || p.ParityHint == "" || p.ParitySampledOut != 0 {
		t.Fatalf("first batch after a clear must be checked: %+v", p)
	}
}

// A due sample is not spent on an event whose parent digest is unknown: the
// next verifiable event is checked instead.
func TestParityDueSampleWaitsForVerifiableEvent(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	n := proveParity(t, e)
	for i := 0; i < ParitySampleEvery-1; i++ {
		e.apply("p", 0, blockkeys.EngineVLLM, rootEvent(t, e.cfg, n, 8))
		n++
	}
	orphan := rootEvent(t, e.cfg, n, 8)
	orphan.ParentHash, orphan.HasParent = 12345, true // parent never seen
	e.apply("p", 0, blockkeys.EngineVLLM, orphan)
	before := e.pod("p", 0)
	e.apply("p", 0, blockkeys.EngineVLLM, rootEvent(t, e.cfg, n+1, 8))
	p := e.pod("p", 0)
	if before.ParityMatches != ParityProofBlocks || p.ParityMatches != ParityProofBlocks+8 {
		t.Fatalf("orphan %+v, next %+v", before, p)
	}
}

func TestParitySamplerStates(t *testing.T) {
	var s paritySampler
	for i := 0; i < ParityProofBlocks-1; i++ {
		if !s.check(false) {
			t.Fatal("unproven pods are always checked")
		}
		s.matched()
	}
	s.matched()
	checked := 0
	for i := 0; i < 10*ParitySampleEvery; i++ {
		if s.check(true) {
			checked++
		}
	}
	if checked != 10 {
		t.Fatalf("%d of %d events checked, want 1 in %d", checked, 10*ParitySampleEvery, ParitySampleEvery)
	}
	s.reset()
	if !s.check(true) || s.proven {
		t.Fatal("reset must return to full checking")
	}
}
