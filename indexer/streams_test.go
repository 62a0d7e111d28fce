package indexer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// runEventIndexer is an indexer whose events come through a running
// subscriber on a loopback bind socket from the returned publisher.
func runEventIndexer(t *testing.T, keys blockkeys.KeyConfig, idx kvindex.Index, workers int) (*Indexer, *enginepub.Publisher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ix, err := New(ctx, Config{Keys: keys,
		Backend: func(context.Context, *kvindex.Interner) (Backend, error) {
			return Backend{Index: idx}, nil
		},
		Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0", Workers: workers}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	pub, err := enginepub.NewPublisher(ix.Subscriber().BindAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pub.Close()
		cancel()
		<-done
		_ = ix.Close()
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := pub.WaitSubscribed(wctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	return ix, pub
}

func publishBatch(t *testing.T, pub *enginepub.Publisher, keys blockkeys.KeyConfig, pod string, rank int, seq uint64, tokens []uint32) {
	t.Helper()
	h, err := blockkeys.NewHasher(keys)
	if err != nil {
		t.Fatal(err)
	}
	var hs []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hs = append(hs, uint64(k))
	}
	p, err := enginepub.EncodeVLLMBatch(&event.Batch{DPRank: rank, Events: []event.Event{{Kind: event.BlockStored,
		BlockHashes: hs, TokenIDs: tokens, BlockSize: keys.BlockSize}}}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("kv@"+pod+"@org/model", seq, p); err != nil {
		t.Fatal(err)
	}
}

// scoreUntil scores q until cond holds over the answer.
func scoreUntil(t *testing.T, ix *Indexer, q *Query, what string, cond func(*Result) bool) *Result {
	t.Helper()
	var r Result
	wait.Until(t, what, func() string {
		if err := ix.Score(context.Background(), q, &r); err != nil {
			t.Fatal(err)
		}
		if cond(&r) {
			return ""
		}
		return fmt.Sprintf("last answer %+v", r.Pods)
	})
	return &r
}

func podOf(r *Result, name string) *PodResult {
	for i := range r.Pods {
		if r.Pods[i].Pod == name {
			return &r.Pods[i]
		}
	}
	return nil
}

// A score answer says, per pod, what the event path knows: a pod one of
// whose scored ranks joined its stream late is incomplete, with the
// reason; a pod whose batch is still waiting to be applied has an apply
// lag (every rank counts, scored or not); the others are complete with no
// lag.
func TestScoreReportsStalenessPerPod(t *testing.T) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}
	held := indextest.NewHeldIndex()
	ix, pub := runEventIndexer(t, keys, held, 1)
	tokens := make([]uint32, 4*4)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	publishBatch(t, pub, keys, "pod-ok", 0, 0, tokens)
	publishBatch(t, pub, keys, "pod-late", 0, 0, tokens)
	publishBatch(t, pub, keys, "pod-late", 1, 7, tokens) // joined after seq 0, no replay endpoint
	q := &Query{Model: "org/model", Kind: InputTokens, TokenIDs: tokens}
	r := scoreUntil(t, ix, q, "both pods scored", func(r *Result) bool {
		p := podOf(r, "pod-late")
		return podOf(r, "pod-ok") != nil && p != nil && len(p.Ranks) == 2
	})
	if p := podOf(r, "pod-ok"); !p.Complete || p.IncompleteReason != "" || p.ApplyLag != 0 {
		t.Fatalf("pod-ok %+v", *p)
	}
	if p := podOf(r, "pod-late"); p.Complete || p.IncompleteReason != "joined_late" {
		t.Fatalf("pod-late %+v, want incomplete (joined_late)", *p)
	}

	// pod-ok's rank 1 (no match: nothing of it is applied yet) waits behind
	// a write that hangs.
	held.Hold()
	publishBatch(t, pub, keys, "pod-ok", 1, 0, tokens)
	<-held.Entered()
	r = scoreUntil(t, ix, q, "pod-ok lagging", func(r *Result) bool {
		p := podOf(r, "pod-ok")
		return p != nil && p.ApplyLag > 0
	})
	if p := podOf(r, "pod-ok"); len(p.Ranks) != 1 || !p.Complete {
		t.Fatalf("pod-ok %+v: its rank 0 alone is scored, and complete", *p)
	}
	held.Release()
	scoreUntil(t, ix, q, "pod-ok caught up", func(r *Result) bool {
		p := podOf(r, "pod-ok")
		return p != nil && p.ApplyLag == 0 && len(p.Ranks) == 2
	})
}

// Filling in the stream states allocates nothing once a reused Result's
// buffers have grown: the score path stays allocation-free with a
// subscriber running.
func TestScoreWithStreamStatesDoesNotAllocate(t *testing.T) {
	if race.Enabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4}
	ix, pub := runEventIndexer(t, keys, kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), 1)
	tokens := seqTokens(100, 8*4)
	for rank := range 2 {
		publishBatch(t, pub, keys, "pod-a", rank, 0, tokens)
		publishBatch(t, pub, keys, "pod-b", rank, 3, tokens) // incomplete: joined late
	}
	h, _ := blockkeys.NewHasher(keys)
	var hs []uint64
	for _, k := range h.Keys(nil, tokens, blockkeys.RequestExtras{}) {
		hs = append(hs, uint64(k))
	}
	q := &Query{Model: "org/model", Kind: InputHashes, BlockHashes: hs}
	r := scoreUntil(t, ix, q, "every rank scored", func(r *Result) bool {
		a, b := podOf(r, "pod-a"), podOf(r, "pod-b")
		return a != nil && b != nil && len(a.Ranks) == 2 && len(b.Ranks) == 2
	})
	if a, b := podOf(r, "pod-a"), podOf(r, "pod-b"); !a.Complete || b.Complete {
		t.Fatalf("pod-a %+v pod-b %+v", *a, *b)
	}
	if n := testing.AllocsPerRun(50, func() {
		if err := ix.Score(context.Background(), q, r); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Score allocates %.1f times per call with stream states, want 0", n)
	}
}
