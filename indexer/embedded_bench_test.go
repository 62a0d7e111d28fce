package indexer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents"
)

// BenchmarkEmbeddedScore is a score through the embedded API as a router
// uses it: the index fed by a running event subscriber (8 engine pods
// publishing over ZMQ, the pod i holding the prompt's first 1-i/8), then
// Score and Pick of a warm prompt of 1k, 8k and 32k token ids into a
// reused result. Its ns/op is what the daemon's gRPC and HTTP paths add
// to (docs/performance.md).
func BenchmarkEmbeddedScore(b *testing.B) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 16}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	idx, err := indexer.New(ctx, indexer.Config{Keys: keys,
		Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0"}})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- idx.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		_ = idx.Close()
	}()
	engines, err := enginepub.NewPublisher(idx.Subscriber().BindAddr(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer engines.Close()

	const pods = 8
	for _, n := range []int{1024, 8192, 32768} {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = uint32(n + i)
		}
		cands := make([]indexer.Candidate, pods)
		for p := range pods {
			pod := fmt.Sprintf("pod-%02d-%d", p, n)
			publishStored(ctx, engines, keys, pod, tokens[:n-p*n/pods])
			cands[p] = indexer.Candidate{Pod: pod, Load: routing.Load{Running: p}}
		}
		q := &indexer.Query{Model: "org/model", Kind: indexer.InputTokens, TokenIDs: tokens}
		var res indexer.Result
		for deadline := time.Now().Add(30 * time.Second); len(res.Pods) < pods; time.Sleep(10 * time.Millisecond) {
			if err := idx.Score(ctx, q, &res); err != nil {
				b.Fatal(err)
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d pods' events applied", len(res.Pods), pods)
			}
		}
		b.Run(fmt.Sprintf("score/tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := idx.Score(ctx, q, &res); err != nil {
					b.Fatal(err)
				}
			}
		})
		pq := &indexer.PickQuery{Query: *q, Candidates: cands, Policy: routing.NameLeastLoaded}
		var pr indexer.PickResult
		b.Run(fmt.Sprintf("pick/tokens=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := idx.Pick(ctx, pq, &pr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
