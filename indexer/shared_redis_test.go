package indexer

import (
	"context"
	"errors"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// redisIndexer is an indexer on the Redis at url with its own interner, as
// a separate daemon has.
func redisIndexer(t *testing.T, url string) *Indexer {
	t.Helper()
	f, err := redisindex.ParseIndexFlag(url + "?namespace=shared")
	if err != nil {
		t.Fatal(err)
	}
	return newTestIndexer(t, Config{Index: IndexConfig{Redis: &f.Redis}})
}

// Two daemons sharing one Redis namespace answer the same request the same
// way, though only one of them received the events: the other learns the
// model and the pods from the shared index on the read path.
func TestSharedRedisSameAnswerOnEveryDaemon(t *testing.T) {
	srv := redistest.Start(t)
	writer := redisIndexer(t, srv.URL())
	reader := redisIndexer(t, srv.URL())

	// The reader interns another model and pod first, so its ids differ
	// from the writer's: names, not ids, must travel through Redis.
	reader.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-z", Model: "reader/only", DPRank: 3, Events: []event.Event{
		storeEvent(seqTokens(9000, 2*testBlock), 2, event.TierGPU)}})
	prompt := seqTokens(100, 6*testBlock)
	writer.Sink().Apply(context.Background(), &event.Batch{Pod: "pod-w", Model: "other/model", Events: []event.Event{
		storeEvent(seqTokens(7000, testBlock), 1, event.TierGPU)}})
	apply(writer, "pod-a", 0, storeEvent(prompt, 5, event.TierGPU))
	apply(writer, "pod-b", 1, storeEvent(prompt, 3, event.TierCPU))

	queries := []Query{
		{Model: testModel, Kind: InputTokens, TokenIDs: prompt},
		{Model: testModel, Kind: InputHashes, BlockHashes: blockHashes(prompt, blockkeys.RequestExtras{})},
		{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"pod-b"}},
		{Model: testModel, Kind: InputTokens, TokenIDs: prompt, Pods: []string{"pod-b", "pod-nobody"}},
	}
	want := []string{
		"total=6 pod-a:5/20/5.00[0:5,] pod-b:3/12/2.40[1:3,]",
		"total=6 pod-a:5/20/5.00[0:5,] pod-b:3/12/2.40[1:3,]",
		"total=6 pod-b:3/12/2.40[1:3,]",
		"total=6 pod-b:3/12/2.40[1:3,]",
	}
	var r Result
	// The pods filter first, on a reader that has not met pod-b at all.
	for _, i := range []int{2, 0, 1, 3} {
		for name, ix := range map[string]*Indexer{"writer": writer, "reader": reader} {
			if got := mustScore(t, ix, &queries[i], &r); got != want[i] {
				t.Errorf("%s, query %d: %s, want %s", name, i, got, want[i])
			}
		}
	}

	// A model nobody wrote stays unknown: names a client makes up are not
	// interned.
	q := Query{Model: "made/up", Kind: InputTokens, TokenIDs: prompt}
	if got := mustScore(t, reader, &q, &r); got != "total=6" {
		t.Errorf("unknown model: %s", got)
	}
	if _, ok := reader.in.LookupModel("made/up"); ok {
		t.Error("a model the shared index does not hold was interned")
	}
	// Redis gone: the fallback lookup is an error, never an empty score.
	srv.Kill()
	q = Query{Model: "other/model", Kind: InputTokens, TokenIDs: seqTokens(7000, testBlock)}
	var e *Error
	if err := reader.Score(context.Background(), &q, &r); err == nil {
		t.Errorf("Redis down: no error, got %s", summary(&r))
	} else if !errors.As(err, &e) || e.Code != Unavailable {
		t.Errorf("Redis down: %v, want Unavailable", err)
	}
}

// Two daemons on one Redis index share speculative entries through it: the
// second identical request, asked of the other daemon before any event,
// goes to the first's pod.
func TestSharedAcrossIndexers(t *testing.T) {
	a, b := twoSharingIndexers(t)
	q := &PickQuery{Query: Query{Model: "m", Kind: InputHashes, BlockHashes: []uint64{11, 12, 13, 14}},
		Candidates: []Candidate{{Pod: "p0", Events: EventsOn}, {Pod: "p1", Events: EventsOn}, {Pod: "p2", Events: EventsOn}}}
	var r PickResult
	if err := a.Pick(context.Background(), q, &r); err != nil {
		t.Fatal(err)
	}
	first := r.Chosen
	q.Candidates[first].Load = routing.Load{Running: 1}
	if err := b.Pick(context.Background(), q, &r); err != nil {
		t.Fatal(err)
	}
	if r.Chosen != first || r.Candidates[first].SpeculativeBlocks != 4 {
		t.Fatalf("daemon b picked %d (%+v), daemon a %d", r.Chosen, r.Candidates[r.Chosen], first)
	}
	// The pod's real events replace the shared speculative entries of
	// blocks 11 and 12 with real ones in the shared index; 13 and 14 stay
	// speculative.
	b.Sink().Apply(context.Background(), &event.Batch{Pod: q.Candidates[first].Pod, Model: "m",
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: []uint64{11, 12}, BlockSize: 4}}})
	if err := b.Pick(context.Background(), q, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Candidates[first]; got.MatchedBlocks != 4 || got.SpeculativeBlocks != 2 || got.Tiers[event.TierGPU] != 2 {
		t.Fatalf("after the pod's events: %+v", got)
	}
}

// A daemon that never met a pod or its model still matches it in Pick
// through the shared index, as Score does: daemon a applied the pod's
// events, daemon b is asked to pick. Before, b matched the unknown
// candidate by its own routing history (approximate, 0 blocks) and picked
// the idle pod instead.
func TestSharedPickFindsPodsOtherDaemonsApplied(t *testing.T) {
	a, b := twoSharingIndexers(t)
	a.Sink().Apply(context.Background(), &event.Batch{Pod: "warm", Model: "m",
		Events: []event.Event{{Kind: event.BlockStored, BlockHashes: []uint64{21, 22, 23, 24}, BlockSize: 4}}})
	for _, mode := range []EventsMode{EventsAuto, EventsOn} {
		q := &PickQuery{Query: Query{Model: "m", Kind: InputHashes, BlockHashes: []uint64{21, 22, 23, 24}},
			Policy:     routing.NameCost,
			Candidates: []Candidate{{Pod: "idle", Events: mode}, {Pod: "warm", Events: mode}}}
		var r PickResult
		if err := b.Pick(context.Background(), q, &r); err != nil {
			t.Fatal(err)
		}
		if got := r.Candidates[1]; r.Pod != "warm" || got.MatchedBlocks != 4 || got.Approximate {
			t.Fatalf("events %v: daemon b picked %q; warm %+v", mode, r.Pod, got)
		}
		if got := r.Candidates[0]; got.MatchedBlocks != 0 {
			t.Fatalf("events %v: idle %+v", mode, got)
		}
	}
}

// twoSharingIndexers returns two indexers sharing one new redis-server, as
// two daemons on one namespace.
func twoSharingIndexers(t *testing.T) (*Indexer, *Indexer) {
	t.Helper()
	srv := redistest.Start(t)
	newIndexer := func() *Indexer {
		ix, err := New(context.Background(), Config{
			Keys:  blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: "0", BlockSize: 4},
			Index: IndexConfig{Redis: &redisindex.Config{URL: srv.URL(), Namespace: "shared"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ix.Close() })
		return ix
	}
	return newIndexer(), newIndexer()
}
