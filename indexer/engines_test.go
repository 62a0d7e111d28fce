package indexer

import (
	"context"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// engineHashes are engine's hashes of tokens' full blocks at the test block
// size (its hashing is proven against the engine's rules by kvindex's
// TestEngineHashVectors).
func engineHashes(e blockkeys.Engine, tokens []uint32) []uint64 {
	var out []uint64
	for _, k := range testHashers.ForEngine(testModel, e).Keys(nil, tokens, blockkeys.RequestExtras{}) {
		out = append(out, uint64(k))
	}
	return out
}

// A request is scored against every engine's pods by that engine's own
// hashes: a vLLM pod, a TensorRT-LLM pod, an SGLang pod that stored its pages with token ids
// and one known only from an engine snapshot (hashes without tokens) all
// score by token ids, Score and Pick alike, and a block_hashes query
// matches the engine whose hashes it names.
func TestScoreEachEngineByItsHashes(t *testing.T) {
	ix := newTestIndexer(t, Config{})
	prompt := seqTokens(7000, 6*testBlock)
	apply(ix, "pod-v", 0, storeEvent(prompt, 3, event.TierGPU))
	sg := engineHashes(blockkeys.EngineSGLang, prompt)
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-s", Model: testModel, Engine: blockkeys.EngineSGLang,
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: sg[:4], TokenIDs: prompt[:4*testBlock], BlockSize: testBlock}}})
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-snap", Model: testModel, Engine: blockkeys.EngineSGLang,
		Events: []event.Event{{Kind: event.BlockSnapshot, BlockHashes: sg[:5]}}})
	trt := engineHashes(blockkeys.EngineTRTLLM, prompt)
	ix.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-t", Model: testModel, Engine: blockkeys.EngineTRTLLM,
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: trt[:2], TokenIDs: prompt[:2*testBlock], BlockSize: testBlock}}})

	var r Result
	want := "total=6 pod-snap:5/20/5.00[0:5,] pod-s:4/16/4.00[0:4,] pod-v:3/12/3.00[0:3,] pod-t:2/8/2.00[0:2,]"
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt}, &r); got != want {
		t.Fatalf("tokens:\n got %s\nwant %s", got, want)
	}
	if got := mustScore(t, ix, &Query{Model: testModel, Kind: InputHashes, BlockHashes: sg}, &r); got != "total=6 pod-snap:5/20/5.00[0:5,] pod-s:4/16/4.00[0:4,]" {
		t.Fatalf("SGLang hashes: %s", got)
	}
	var pr PickResult
	q := &PickQuery{Query: Query{Model: testModel, Kind: InputTokens, TokenIDs: prompt},
		Candidates: []Candidate{idle("pod-v"), idle("pod-s"), idle("pod-snap")}}
	if err := ix.Pick(context.Background(), q, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Pod != "pod-snap" || pr.Candidates[0].MatchedBlocks != 3 || pr.Candidates[1].MatchedBlocks != 4 || pr.Candidates[2].MatchedBlocks != 5 {
		t.Fatalf("pick: %s %+v", pr.Pod, pr.Candidates)
	}
}
