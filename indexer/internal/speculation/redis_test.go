package speculation

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

func newStore(t *testing.T, ttl time.Duration) (*RedisStore, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	s, err := NewRedis(c, "test", ttl)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

func keys(n int) []blockkeys.Key {
	k := make([]blockkeys.Key, n)
	for i := range k {
		k[i] = blockkeys.Key(1000 + i)
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
	if err := s.Drop(ctx, "m", []blockkeys.Key{ks[10], ks[5]}, [2]uint64{7, 70}); err != nil {
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
	wait.Until(t, "the entries' 50 ms TTL", func() string {
		if err := s.Extend(ctx, "m", ks, []uint64{7}, []int32{0}, ext); err != nil {
			t.Fatal(err)
		}
		if ext[0] == 0 {
			return ""
		}
		return fmt.Sprintf("%d entries still there", ext[0])
	})
}

// Drop removes the entries of either holder (a pod with and without its
// rank) in one round trip once its script is loaded, keeps another
// holder's, and loads the script again when the server lost it.
func TestDropBothHoldersOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	var rt redistest.RoundTrips
	rt.Attach(c)
	s, err := NewRedis(c, "test", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ks := keys(6)
	for i, holder := range []uint64{7, 70, 9} { // blocks 0-1, 2-3, 4-5
		if err := s.Hold(ctx, "m", ks[2*i:2*i+2], holder); err != nil {
			t.Fatal(err)
		}
	}
	all := ks
	if err := s.Drop(ctx, "m", all[:1], [2]uint64{7, 70}); err != nil { // loads the script
		t.Fatal(err)
	}
	rt.Reset()
	if err := s.Drop(ctx, "m", all, [2]uint64{7, 70}); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 1 {
		t.Errorf("Drop of %d blocks for two holders took %d round trips, want 1", len(all), n)
	}
	ext := make([]int32, 3)
	if err := s.Extend(ctx, "m", ks, []uint64{7, 70, 9}, []int32{0, 2, 4}, ext); err != nil {
		t.Fatal(err)
	}
	if ext[0] != 0 || ext[1] != 0 || ext[2] != 2 {
		t.Fatalf("after the drop: holders 7, 70, 9 extend %v, want [0 0 2]", ext)
	}
	// A server that lost its scripts (a restart, SCRIPT FLUSH) answers
	// NOSCRIPT: Drop loads the script again and drops.
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := s.Drop(ctx, "m", all, [2]uint64{9, 90}); err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
	if err := s.Extend(ctx, "m", ks, []uint64{9}, []int32{4}, ext[:1]); err != nil || ext[0] != 0 {
		t.Fatalf("after SCRIPT FLUSH: holder 9 extends %d (%v), want 0", ext[0], err)
	}
}
