package redisspec

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
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
