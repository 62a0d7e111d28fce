package redisindex

import (
	"context"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// A holder's field is "<tier>.0.<dp rank>.<pod name>" for every daemon
// sharing a namespace; a record whose second component is not 0 was not
// written by this version: it is skipped and counted as malformed, on both
// lookup paths, and the block's other holders are still read.
func TestHolderFieldFormat(t *testing.T) {
	s := redistest.Start(t)
	for _, walk := range []bool{false, true} {
		name := map[bool]string{false: "pipeline", true: "server-walk"}[walk]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			idx, in := newTestIndex(t, s.URL(), func(c *Config) { c.ServerWalk = walk })
			m, p := in.Model("m"), in.Pod("pod-a", 3)
			keys := seqKeys(1, 7)
			if err := idx.Add(ctx, m, p, event.TierCPU, keys); err != nil {
				t.Fatal(err)
			}
			bk := blockKeys(nil, idx.modelPrefix(m), keys)[0]
			v, err := idx.Client().Get(ctx, bk).Result()
			fields, ferr := recordFields(v, err)
			if ferr != nil || !slices.Equal(fields, []string{"1.0.3.pod-a"}) {
				t.Fatalf("fields %q (%v), want [1.0.3.pod-a]", fields, ferr)
			}
			v += encodeRecord("0.2.0.pod-b", 1<<40)
			if err := idx.Client().Set(ctx, bk, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			got := indextest.Lookup(t, idx, m, keys, -1)
			if len(got) != 1 || !slices.Equal(got[0].Holders, []kvindex.Holder{{Pod: p, Tier: event.TierCPU}}) {
				t.Fatalf("lookup %v, want only pod-a on the CPU tier", got)
			}
			if n := idx.Malformed(); n != 1 {
				t.Fatalf("Malformed = %d, want 1", n)
			}
		})
	}
}
