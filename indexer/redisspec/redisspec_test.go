package redisspec

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	"github.com/kvindex/kvindex/routing"
)

func newStore(t *testing.T, ttl time.Duration) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, "test", ttl)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

func keys(n int) []kvindex.Key {
	k := make([]kvindex.Key, n)
	for i := range k {
		k[i] = kvindex.Key(1000 + i)
	}
	return k
}

func TestHoldExtendDrop(t *testing.T) {
	s, _ := newStore(t, time.Minute)
	ctx := context.Background()
	ks := keys(1200) // more than two read windows
	if err := s.Hold(ctx, "m", ks[3:1100], 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Hold(ctx, "m", ks[5:6], 9); err != nil { // a later pick of block 5 by another pod
		t.Fatal(err)
	}
	holders := []uint64{7, 7, 7, 8, 9}
	start := []int32{3, 6, 1100, 3, 5}
	ext := make([]int32, len(holders))
	if err := s.Extend(ctx, "m", ks, holders, start, ext); err != nil {
		t.Fatal(err)
	}
	want := []int32{2, 1094, 0, 0, 1}
	for i := range want {
		if ext[i] != want[i] {
			t.Errorf("ext[%d] = %d, want %d", i, ext[i], want[i])
		}
	}
	// Another model shares nothing.
	if err := s.Extend(ctx, "other", ks, holders[:1], start[:1], ext[:1]); err != nil || ext[0] != 0 {
		t.Fatalf("other model: %d %v", ext[0], err)
	}
	// Pod 7's events for blocks 10 and 5: 10 goes, 5 (now pod 9's) stays.
	if err := s.Drop(ctx, "m", []uint64{uint64(ks[10]), uint64(ks[5])}, 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, "m", ks, []uint64{7, 9}, []int32{6, 5}, ext[:2]); err != nil {
		t.Fatal(err)
	}
	if ext[0] != 4 || ext[1] != 1 {
		t.Fatalf("after drop: %v", ext[:2])
	}
}

func TestEntriesExpire(t *testing.T) {
	s, _ := newStore(t, 50*time.Millisecond)
	ctx := context.Background()
	ks := keys(4)
	if err := s.Hold(ctx, "m", ks, 7); err != nil {
		t.Fatal(err)
	}
	ext := make([]int32, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.Extend(ctx, "m", ks, []uint64{7}, []int32{0}, ext); err != nil {
			t.Fatal(err)
		}
		if ext[0] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("entries still there after 10s with a 50ms TTL: %d", ext[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Two daemons, each with its own index, share speculative entries through
// one Redis: the second identical request, asked of the other daemon before
// any event, goes to the first's pod.
func TestSharedAcrossIndexers(t *testing.T) {
	srv := redistest.Start(t)
	newIndexer := func() *indexer.Indexer {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { c.Close() })
		x, err := indexer.New(context.Background(), indexer.Config{
			Keys: kvindex.KeyConfig{Algo: kvindex.AlgoSHA256, Seed: "0", BlockSize: 4},
			Pick: indexer.PickConfig{SharedSpeculative: func(_ kvindex.Index, ttl time.Duration) (indexer.SpeculativeStore, error) {
				return New(c, "shared", ttl)
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	a, b := newIndexer(), newIndexer()
	q := &indexer.PickQuery{Query: indexer.Query{Model: "m", Kind: indexer.InputHashes, BlockHashes: []uint64{11, 12, 13, 14}},
		Candidates: []indexer.Candidate{{Pod: "p0", Events: indexer.EventsOn}, {Pod: "p1", Events: indexer.EventsOn}, {Pod: "p2", Events: indexer.EventsOn}}}
	var r indexer.PickResult
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
	// The pod's real events, seen by daemon b, replace the shared entries
	// for every daemon. (These test daemons have separate in-memory
	// indexes, so daemon a, which never saw the events, now finds nothing
	// from block 0: the entries of blocks 11 and 12 are gone from Redis.)
	b.Sink().Apply(context.Background(), &kvindex.Batch{Pod: q.Candidates[first].Pod, Model: "m",
		Events: []kvindex.Event{{Kind: kvindex.BlockStored, BlockHashes: []uint64{11, 12}, BlockSize: 4}}})
	if err := a.Pick(context.Background(), q, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.Candidates[first]; got.MatchedBlocks != 0 || got.SpeculativeBlocks != 0 {
		t.Fatalf("daemon a after the events seen by b: %+v", got)
	}
}
