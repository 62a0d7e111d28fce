package promises

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestEmbeddedMatchesDaemon: package indexer embedded in a router's process
// and the kvindexd binary, fed the same engine events, give the same Score
// and Pick answers, number for number (the embedded API is the daemon minus
// its transports).
func TestEmbeddedMatchesDaemon(t *testing.T) {
	d := harness.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	// The embedded index with the daemon's default keys (what
	// engineHashes computes) and pick settings, bound as the daemon is.
	idx, err := indexer.New(ctx, indexer.Config{Keys: blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: blockkeys.DefaultSeed, BlockSize: blockSize},
		Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0"}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- idx.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("embedded Run: %v", err)
		}
		_ = idx.Close()
	})
	embPub, err := enginepub.NewPublisher(idx.Subscriber().BindAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(embPub.Close)
	wctx, wcancel := context.WithTimeout(ctx, wait.Limit)
	defer wcancel()
	if err := embPub.WaitSubscribed(wctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	pubs := []*enginepub.Publisher{d.Publisher(), embPub}

	// The same engine messages to both: three pods holding prefixes of
	// two prompts, one on the CPU tier, one with blocks removed again.
	shared, other := prompt(1, 12), prompt(2, 6)
	sh, oh := engineHashes(t, shared), engineHashes(t, other)
	cpu := stored(sh[:6], shared[:6*blockSize])
	cpu.Events[0].Medium = event.TierCPU
	msgs := []struct {
		pod string
		b   *event.Batch
	}{
		{"pod-a", stored(sh, shared)},
		{"pod-b", cpu},
		{"pod-c", stored(oh, other)},
		{"pod-c", stored(sh[:3], shared[:3*blockSize])},
		{"pod-a", &event.Batch{Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: sh[9:]}}}},
	}
	seq := map[string]uint64{}
	for _, m := range msgs {
		for _, p := range pubs {
			publish(t, p, m.pod, model, seq[m.pod], m.b)
		}
		seq[m.pod]++
	}

	grpcC, _ := grpcClient(t, d)
	tokens := func(ids []uint32) *kvindexv1.TokenIDs { return &kvindexv1.TokenIDs{Ids: ids} }
	queries := []struct {
		name string
		q    indexer.Query
	}{
		{"shared", indexer.Query{Model: model, Kind: indexer.InputTokens, TokenIDs: shared}},
		{"other", indexer.Query{Model: model, Kind: indexer.InputTokens, TokenIDs: append(append([]uint32{}, other...), 5, 5)}},
		{"hashes", indexer.Query{Model: model, Kind: indexer.InputHashes, BlockHashes: sh[:8]}},
		{"filtered", indexer.Query{Model: model, Kind: indexer.InputTokens, TokenIDs: shared, Pods: []string{"pod-b", "pod-c"}}},
	}
	score := func(q indexer.Query) (emb, dmn string) {
		var r indexer.Result
		if err := idx.Score(ctx, &q, &r); err != nil {
			emb = "error: " + err.Error()
		} else {
			emb = fmt.Sprintf("total=%d", r.TotalBlocks)
			for _, p := range r.Pods {
				emb += fmt.Sprintf(" %s=%d/%d/%.4g%s", p.Pod, p.MatchedBlocks, p.MatchedTokens, p.Score, ranks(len(p.Ranks)))
			}
		}
		req := &kvindexv1.ScoreRequest{Model: q.Model, Pods: q.Pods}
		if q.Kind == indexer.InputTokens {
			req.Input = &kvindexv1.ScoreRequest_TokenIds{TokenIds: tokens(q.TokenIDs)}
		} else {
			req.Input = &kvindexv1.ScoreRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: q.BlockHashes}}
		}
		c, cc := withToken("")
		defer cc()
		g, err := grpcC.Score(c, req)
		if err != nil {
			return emb, "error: " + err.Error()
		}
		dmn = fmt.Sprintf("total=%d", g.GetTotalBlocks())
		for _, p := range g.GetPods() {
			dmn += fmt.Sprintf(" %s=%d/%d/%.4g%s", p.GetPod(), p.GetMatchedBlocks(), p.GetMatchedTokens(), p.GetScore(), ranks(len(p.GetDpRanks())))
		}
		return emb, dmn
	}
	// Both have applied every message when the last one (pod-a's removal)
	// shows on both sides.
	want := "total=12 pod-a=9/144/9[1 ranks] pod-b=6/96/"
	wait.Until(t, "both sides apply the events", func() string {
		emb, dmn := score(queries[0].q)
		if !strings.HasPrefix(emb, want) || !strings.HasPrefix(dmn, want) {
			return fmt.Sprintf("embedded %q, daemon %q, want prefix %q", emb, dmn, want)
		}
		return ""
	})
	for _, tc := range queries {
		if emb, dmn := score(tc.q); emb != dmn {
			t.Errorf("Score %s:\n embedded %s\n daemon   %s", tc.name, emb, dmn)
		}
	}

	// Picks, in the same order on both sides: each pick's speculative
	// entries are part of the next one's answer.
	cands := []indexer.Candidate{{Pod: "pod-a", Load: routing.Load{Running: 4, Waiting: 1, KVUsage: 0.7}},
		{Pod: "pod-b", Load: routing.Load{Running: 1, KVUsage: 0.2}}, {Pod: "pod-c", Load: routing.Load{Running: 2, KVUsage: 0.4}},
		{Pod: "pod-x", Events: indexer.EventsOff}}
	for _, tc := range []struct {
		q      indexer.Query
		policy string
	}{{queries[0].q, ""}, {queries[1].q, ""}, {queries[0].q, routing.NameLeastLoaded}, {queries[2].q, ""}, {queries[1].q, ""}} {
		pq := indexer.PickQuery{Query: tc.q, Candidates: cands, Policy: tc.policy}
		var pr indexer.PickResult
		emb := ""
		if err := idx.Pick(ctx, &pq, &pr); err != nil {
			emb = "error: " + err.Error()
		} else {
			emb = fmt.Sprintf("%s %s %s total=%d", pr.Pod, pr.Policy, pr.Reason, pr.TotalBlocks)
			for _, c := range pr.Candidates {
				emb += fmt.Sprintf(" %s=%d/%d/%t/%.4g/%.4g/%.4g", c.Pod, c.MatchedBlocks, c.SpeculativeBlocks, c.Approximate, c.Cached, c.Score, c.Cost)
			}
		}
		req := &kvindexv1.PickRequest{Model: tc.q.Model, Policy: tc.policy}
		if tc.q.Kind == indexer.InputTokens {
			req.Input = &kvindexv1.PickRequest_TokenIds{TokenIds: tokens(tc.q.TokenIDs)}
		} else {
			req.Input = &kvindexv1.PickRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: tc.q.BlockHashes}}
		}
		for _, c := range cands {
			pc := &kvindexv1.Candidate{Pod: c.Pod, Running: int32(c.Running), Waiting: int32(c.Waiting), KvUsage: c.KVUsage}
			if c.Events == indexer.EventsOff {
				off := false
				pc.Events = &off
			}
			req.Candidates = append(req.Candidates, pc)
		}
		c, cc := withToken("")
		g, err := grpcC.Pick(c, req)
		cc()
		dmn := ""
		if err != nil {
			dmn = "error: " + err.Error()
		} else {
			dmn = fmt.Sprintf("%s %s %s total=%d", g.GetPod(), g.GetPolicy(), g.GetReason(), g.GetTotalBlocks())
			for _, c := range g.GetCandidates() {
				dmn += fmt.Sprintf(" %s=%d/%d/%t/%.4g/%.4g/%.4g", c.GetPod(), c.GetMatchedBlocks(), c.GetSpeculativeBlocks(),
					c.GetApproximate(), c.GetCached(), c.GetScore(), c.GetCost())
			}
		}
		if emb != dmn {
			t.Errorf("Pick %s policy %q:\n embedded %s\n daemon   %s", tc.q.Kind, tc.policy, emb, dmn)
		} else {
			t.Logf("Pick %s policy %q: %s", tc.q.Kind, tc.policy, emb)
		}
	}

	// A P/D pick: pod-c decodes, pod-b prefills, pod-a (not offered) holds
	// more than both. Same pair, decision and kv_source on both sides.
	pdCands := []indexer.Candidate{{Pod: "pod-b", Role: routing.RolePrefill}, {Pod: "pod-c", Role: routing.RoleDecode}}
	pq := indexer.PickQuery{Query: queries[0].q, Candidates: pdCands}
	var pr indexer.PickResult
	emb := ""
	if err := idx.Pick(ctx, &pq, &pr); err != nil {
		emb = "error: " + err.Error()
	} else {
		emb = fmt.Sprintf("%s %s %d prefill=%s source=%s/%d/%d", pr.Pod, pr.Split, pr.NonCachedTokens, pr.PrefillPod,
			pr.KVSource.Pod, pr.KVSource.Blocks, pr.KVSource.ExtraBlocks)
	}
	req := &kvindexv1.PickRequest{Model: model, Input: &kvindexv1.PickRequest_TokenIds{TokenIds: tokens(queries[0].q.TokenIDs)},
		Candidates: []*kvindexv1.Candidate{{Pod: "pod-b", Role: "prefill"}, {Pod: "pod-c", Role: "decode"}}}
	c, cc := withToken("")
	g, err := grpcC.Pick(c, req)
	cc()
	dmn := ""
	if err != nil {
		dmn = "error: " + err.Error()
	} else {
		dmn = fmt.Sprintf("%s %s %d prefill=%s source=%s/%d/%d", g.GetPod(), g.GetDisaggregation().GetDecision(),
			g.GetDisaggregation().GetNonCachedTokens(), g.GetPrefillPod().GetPod(), g.GetKvSource().GetPod(),
			g.GetKvSource().GetBlocks(), g.GetKvSource().GetExtraBlocks())
	}
	if emb != dmn {
		t.Errorf("P/D pick:\n embedded %s\n daemon   %s", emb, dmn)
	} else {
		t.Logf("P/D pick: %s", emb)
	}
}

func ranks(n int) string { return fmt.Sprintf("[%d ranks]", n) }
