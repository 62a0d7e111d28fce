package applier

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// lora_id 0 is "no LoRA" (some engines send 0 rather than nil): the block
// is hashed without LoRA extras and verified.
func TestApplierLoraIDZeroIsNoLoRA(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(70, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	ev := stored(eh, toks, 4, 0, 2)
	ev.LoraID, ev.HasLoraID = 0, true
	e.apply("p", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 2 || p.ParityUnverified != 0 {
		t.Fatalf("lora_id 0: %+v, want 2 matches", p)
	}
}

// An event without block_size (0: not sent) says nothing about the block
// size: it is verified, not flagged as a block-size mismatch.
func TestApplierMissingBlockSizeIsNotWrong(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(80, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	ev := stored(eh, toks, 4, 0, 2)
	ev.BlockSize = 0
	e.apply("p", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 2 || p.ParityMismatches != 0 || p.ParityHint != "" {
		t.Fatalf("no block_size: %+v, want 2 matches and no hint", p)
	}
}

// Token ids that do not fill exactly n blocks cannot be split into the
// event's blocks with certainty: none is hashed, all are unverified and
// indexed under the engine's hashes.
func TestApplierTokenCountMustBeBlocksTimesSize(t *testing.T) {
	for _, extra := range []int{1, -1, 4} {
		t.Run(fmt.Sprint(extra), func(t *testing.T) {
			e := newApplierEnv(t, cborSeed0)
			toks := seq(90, 12)
			eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
			ev := event.Event{Kind: event.BlockStored, BlockHashes: eh[:2], TokenIDs: toks[:8+extra], BlockSize: 4}
			e.apply("p", 0, blockkeys.EngineVLLM, ev)
			p := e.pod("p", 0)
			if p.ParityMatches != 0 || p.ParityMismatches != 0 || p.ParityUnverified != 2 {
				t.Fatalf("%d tokens for 2 blocks of 4: %+v, want 2 unverified", 8+extra, p)
			}
			id := e.podID("p", 0)
			for _, k := range eh[:2] {
				if !e.idx.has(id, blockkeys.Key(k)) {
					t.Fatalf("engine hash %d not indexed", k)
				}
			}
		})
	}
}

// Within one event, a block that cannot be verified (here: an extra key we
// cannot serialise) does not end verification: the next block's parent is
// the engine hash of the unverifiable one, whose digest is known from an
// earlier event, so the chain resumes.
func TestApplierChainResumesAfterUnverifiableBlock(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(100, 16)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 4))
	if p := e.pod("p", 0); p.ParityMatches != 4 {
		t.Fatalf("first pass: %+v", p)
	}
	ev := stored(eh, toks, 4, 0, 4)
	ev.ExtraKeys = [][]any{nil, {1.5}, nil, nil}
	e.apply("p", 0, blockkeys.EngineVLLM, ev)
	if p := e.pod("p", 0); p.ParityMatches != 4+3 || p.ParityUnverified != 1 {
		t.Fatalf("second pass: %+v, want 3 more matches and 1 unverified", p)
	}
}

// The algorithm/seed diagnosis rehashes a request's FIRST block with the
// other algorithms. A mismatch first seen on a later block of a
// parentless event (its block 0 unverifiable) must not conclude anything
// from it; the next request's first block then names the algorithm.
func TestApplierDiagnosisWaitsForAFirstBlock(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	engineCfg := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}
	toks := seq(200, 8)
	eh := engineKeys(t, engineCfg, toks, blockkeys.RequestExtras{})
	// another pod stores block 0: the model's digest cache now knows it
	e.apply("a", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	// pod b: block 0 unverifiable, block 1 hashed from the cached digest and
	// mismatching
	ev := stored(eh, toks, 4, 0, 2)
	ev.ExtraKeys = [][]any{{1.5}, nil}
	e.apply("b", 0, blockkeys.EngineVLLM, ev)
	p := e.pod("b", 0)
	if p.ParityMismatches != 1 || p.ParityUnverified != 1 {
		t.Fatalf("pod b: %+v, want block 1 mismatching and block 0 unverified", p)
	}
	if !strings.Contains(p.ParityHint, "waiting for a request's first block") {
		t.Fatalf("hint from a non-first block: %q", p.ParityHint)
	}
	e.apply("b", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	if p := e.pod("b", 0); !strings.HasPrefix(p.ParityHint, "hash algorithm: the engine hashes with sha256 ") {
		t.Fatalf("hint after a first block: %q", p.ParityHint)
	}
}
