package indexer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
)

// A router embeds the index: it subscribes to its engines' KV events
// itself and asks Score and Pick in process, with no daemon in between.
func Example() {
	// The engine: a vLLM pod publishing KV events on a bound ZMQ socket
	// (the per-pod topology). enginepub stands in for it here.
	engine, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	// The keys must be the engines': their hash algorithm, block size and
	// PYTHONHASHSEED.
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
	ctx, cancel := context.WithCancel(context.Background())
	idx, err := indexer.New(ctx, indexer.Config{
		Keys: keys,
		Events: &kvevents.Config{Endpoints: []kvevents.EndpointConfig{
			{Address: engine.Addr(), Pod: "10.0.0.1:8000", Model: "org/model"},
		}},
	})
	if err != nil {
		panic(err)
	}
	// Run subscribes and applies events until ctx ends; Close after it.
	done := make(chan error, 1)
	go func() { done <- idx.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		_ = idx.Close()
	}()

	// The engine stores a 64-token prompt (4 blocks) once the index has
	// subscribed.
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	publishStored(ctx, engine, keys, "10.0.0.1:8000", tokens)

	// Score: which pods hold how much of a request. Events are applied
	// asynchronously, so wait for the engine's blocks to be in.
	q := &indexer.Query{Model: "org/model", Kind: indexer.InputTokens, TokenIDs: append(tokens, 7, 7, 7)}
	var res indexer.Result // reused across calls: scoring allocates nothing per block
	for {
		if err := idx.Score(ctx, q, &res); err != nil {
			panic(err)
		}
		if len(res.Pods) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("score: %s holds %d of %d blocks\n", res.Pods[0].Pod, res.Pods[0].MatchedBlocks, res.TotalBlocks)

	// Pick: where to send it among the router's candidates and their load.
	pq := &indexer.PickQuery{Query: *q, Candidates: []indexer.Candidate{
		{Pod: "10.0.0.2:8000", Load: routing.Load{Running: 1}},
		{Pod: "10.0.0.1:8000", Load: routing.Load{Running: 2}},
	}}
	var pr indexer.PickResult
	if err := idx.Pick(ctx, pq, &pr); err != nil {
		panic(err)
	}
	fmt.Printf("pick: %s (policy %s, %s)\n", pr.Pod, pr.Policy, pr.Reason)
	// Output:
	// score: 10.0.0.1:8000 holds 4 of 4 blocks
	// pick: 10.0.0.1:8000 (policy sglang, best-prefix)
}

// publishStored sends the vLLM BlockStored batch an engine sends after
// computing tokens, once a subscriber is attached.
func publishStored(ctx context.Context, engine *enginepub.Publisher, keys blockkeys.KeyConfig, pod string, tokens []uint32) {
	h, err := blockkeys.NewHasher(keys)
	if err != nil {
		panic(err)
	}
	var hashes []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hashes = append(hashes, uint64(k))
	}
	payload, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: []event.Event{{Kind: event.BlockStored,
		BlockHashes: hashes, TokenIDs: tokens, BlockSize: keys.BlockSize}}}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		panic(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := engine.WaitSubscribed(wctx, "kv@"); err != nil {
		panic(err)
	}
	if err := engine.Publish("kv@"+pod+"@org/model", 0, payload); err != nil {
		panic(err)
	}
}
