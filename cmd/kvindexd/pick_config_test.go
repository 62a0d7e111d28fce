package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

func TestPickConfig(t *testing.T) {
	c := Config{PickPolicy: "aibrix", SpecTTL: "500ms", HistoryTTL: "-1s", HistoryCapacity: 10}
	pc, err := c.pickConfig()
	if err != nil || pc.DefaultPolicy != "aibrix" || pc.SpeculativeTTL != 500*time.Millisecond || pc.HistoryTTL != -time.Second || pc.HistoryCapacity != 10 {
		t.Fatalf("%+v %v", pc, err)
	}
	for _, bad := range []Config{{PickPolicy: "best"}, {SpecTTL: "soon"}, {HistoryTTL: "0s"}, {HistoryCapacity: -1}} {
		if _, err := bad.pickConfig(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// With the Redis index, speculative entries go to the same Redis; with the
// in-memory index they stay in process.
func TestSharedSpeculativeFollowsTheIndex(t *testing.T) {
	if s, err := sharedSpeculative(kvindex.NewMemoryIndex(kvindex.MemoryConfig{}), time.Second); s != nil || err != nil {
		t.Fatalf("memory index: %v %v", s, err)
	}
	srv := redistest.Start(t)
	idx, err := redisindex.New(context.Background(), redisindex.Config{URL: srv.URL(), Interner: kvindex.NewInterner()})
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	s, err := sharedSpeculative(idx, time.Second)
	if err != nil || s == nil {
		t.Fatalf("redis index: %v %v", s, err)
	}
	ks := []kvindex.Key{1, 2}
	if err := s.Hold(context.Background(), "m", ks, 42); err != nil {
		t.Fatal(err)
	}
	ext := []int32{0}
	if err := s.Extend(context.Background(), "m", ks, []uint64{42}, []int32{0}, ext); err != nil || ext[0] != 2 {
		t.Fatalf("extend: %v %v", ext, err)
	}
}
