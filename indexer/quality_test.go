package indexer

import (
	"bytes"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

func histogram(t *testing.T, ix *Indexer, name, model string) (count uint64, sum float64) {
	t.Helper()
	reg, _ := registries.Load(ix)
	mfs, err := reg.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" && lp.GetValue() == model {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, -1
}

func tokenQuery(model string, prompt []uint32, cands ...Candidate) *PickQuery {
	return &PickQuery{Query: Query{Model: model, Kind: InputTokens, TokenIDs: prompt}, Candidates: cands}
}

var model1 = map[string]string{"model": testModel}

// The chosen pod's share of the request's blocks is observed per model: a
// pod holding 12 of 16 blocks wins among idle pods, share 0.75.
func TestPickQualityCachedShare(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 16*testBlock)
	apply(ix, "a", 0, storeEvent(prompt, 12, event.TierGPU))
	apply(ix, "b", 0, storeEvent(prompt, 4, event.TierCPU))
	var r PickResult
	mustPick(t, ix, tokenQuery(testModel, prompt, idle("a"), idle("b")), &r)
	if r.Pod != "a" || r.PickID == 0 {
		t.Fatalf("picked %q id %x", r.Pod, r.PickID)
	}
	if n, sum := histogram(t, ix, "kvindexd_pick_cached_share", testModel); n != 1 || sum != 0.75 {
		t.Fatalf("cached share histogram: count %d sum %v, want 1 and 0.75", n, sum)
	}
	if got := counterValue(t, ix, "kvindexd_pick_cached_blocks_total", model1); got != 12 {
		t.Errorf("cached blocks = %v, want 12", got)
	}
	if got := counterValue(t, ix, "kvindexd_pick_prompt_blocks_total", model1); got != 16 {
		t.Errorf("prompt blocks = %v, want 16", got)
	}
	if got := counterValue(t, ix, "kvindexd_pick_cached_tier_blocks_total", map[string]string{"model": testModel, "tier": "gpu"}); got != 12 {
		t.Errorf("gpu tier blocks = %v, want 12", got)
	}
	for _, name := range []string{"kvindexd_pick_affinity_pressure_total", "kvindexd_pick_cold_total"} {
		if got := counterValue(t, ix, name, model1); got != 0 {
			t.Errorf("%s = %v after the best pod won", name, got)
		}
	}
	// A second pick of the same prompt: the speculative entries make "a"
	// hold all 16 blocks now; the mean share is (0.75 + 1) / 2.
	mustPick(t, ix, tokenQuery(testModel, prompt, idle("a"), idle("b")), &r)
	if n, sum := histogram(t, ix, "kvindexd_pick_cached_share", testModel); n != 2 || sum != 1.75 {
		t.Fatalf("cached share after two picks: count %d sum %v", n, sum)
	}
	qs := ix.Quality()
	if len(qs) != 1 || qs[0].Model != testModel || qs[0].Picks != 2 || qs[0].CachedBlocks != 28 || qs[0].PromptBlocks != 32 {
		t.Fatalf("Quality() = %+v", qs)
	}
	h := qs[0].History
	if len(h) != qualitySteps || h[len(h)-1].Picks != 2 || h[len(h)-1].CachedBlocks != 28 || h[0].Picks != 0 {
		t.Fatalf("history's last step %+v", h[len(h)-1])
	}
	if len(qs[0].Pods) != 1 || qs[0].Pods[0].Pod != "a" || qs[0].Pods[0].Picks != 2 {
		t.Fatalf("pods %+v", qs[0].Pods)
	}
}

// Affinity pressure and cold picks: the pod holding the whole prompt is
// loaded, the cost model sends the request to an idle pod holding nothing.
// A prefix the policy calls too short (sglang's cache threshold) is no
// pressure.
func TestPickQualityAffinityPressureAndCold(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	prompt := seqTokens(1, 16*testBlock)
	apply(ix, "hot", 0, storeEvent(prompt, 16, event.TierGPU))
	var r PickResult
	q := tokenQuery(testModel, prompt, Candidate{Pod: "hot", Load: routing.Load{Running: 3}}, Candidate{Pod: "idle", Events: EventsOn})
	q.Policy = routing.NameCost
	mustPick(t, ix, q, &r)
	if r.Pod != "idle" {
		t.Fatalf("picked %q", r.Pod)
	}
	if got := counterValue(t, ix, "kvindexd_pick_affinity_pressure_total", model1); got != 1 {
		t.Errorf("affinity pressure = %v, want 1", got)
	}
	if got := counterValue(t, ix, "kvindexd_pick_cold_total", model1); got != 1 {
		t.Errorf("cold picks = %v, want 1", got)
	}
	if got := counterValue(t, ix, "kvindexd_pick_prefix_held_total", model1); got != 1 {
		t.Errorf("prefix held = %v, want 1", got)
	}

	// 2 of 16 blocks is below sglang's 30% threshold: load decides, and
	// that is not the warm pod being forced off.
	other := seqTokens(5000, 16*testBlock)
	apply(ix, "warm", 0, storeEvent(other, 2, event.TierGPU))
	q = tokenQuery(testModel, other, Candidate{Pod: "warm", Load: routing.Load{Running: 1}}, Candidate{Pod: "idle2", Events: EventsOn})
	q.Policy = routing.NameSGLang
	mustPick(t, ix, q, &r)
	if r.Pod != "idle2" || r.Reason != routing.ReasonNoMatch {
		t.Fatalf("picked %q (%v)", r.Pod, r.Reason)
	}
	if got := counterValue(t, ix, "kvindexd_pick_affinity_pressure_total", model1); got != 1 {
		t.Errorf("affinity pressure = %v after a no-match pick, want still 1", got)
	}
	if got := counterValue(t, ix, "kvindexd_pick_cold_total", model1); got != 2 {
		t.Errorf("cold picks = %v, want 2", got)
	}
}

// A model no engine published for cannot add series: its picks share the
// OtherModel label.
func TestPickQualityUnknownModelsShareOneLabel(t *testing.T) {
	ix := newPickIndexer(t, newFakeClock(), PickConfig{})
	var r PickResult
	for _, m := range []string{"made-up/1", "made-up/2", "made-up/3"} {
		mustPick(t, ix, tokenQuery(m, seqTokens(1, 8*testBlock), idle("a"), idle("b")), &r)
	}
	if n, _ := histogram(t, ix, "kvindexd_pick_cached_share", OtherModel); n != 3 {
		t.Fatalf("picks under %s = %d, want 3", OtherModel, n)
	}
	if n, _ := histogram(t, ix, "kvindexd_pick_cached_share", "made-up/1"); n != 0 {
		t.Fatal("an unknown model got its own series")
	}
}

// The engine's rule, from vLLM's v1 KVCacheManager.get_computed_blocks: a
// hit is capped at prompt length - 1 and counted in whole blocks.
func TestEngineCachedTokens(t *testing.T) {
	for _, c := range []struct{ matched, bs, prompt, want int }{
		{16, 4, 64, 60},   // the whole prompt cached: its last block is recomputed
		{16, 4, 66, 64},   // a partial last block: every full block is a hit
		{16, 4, 65, 64},   // one token past the blocks: prompt-1 = 64
		{3, 16, 1000, 48}, // a short prefix: no cap
		{1, 16, 16, 0},    // one block prompt fully cached: nothing reported
		{0, 16, 100, 0},
		{5, 16, 0, 80}, // prompt length unknown: no cap
	} {
		if got := EngineCachedTokens(c.matched, c.bs, c.prompt); got != c.want {
			t.Errorf("EngineCachedTokens(%d, %d, %d) = %d, want %d", c.matched, c.bs, c.prompt, got, c.want)
		}
	}
}

func feedbackIndexer(t *testing.T, clk *fakeClock) (*Indexer, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Pick: PickConfig{Now: clk.Now}, Registry: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	registries.Store(ix, reg)
	return ix, &logs
}

func wantCode(t *testing.T, err error, c Code) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != c {
		t.Fatalf("error %v, want code %v", err, c)
	}
}

// Feedback that agrees with the index under vLLM's rule raises nothing;
// an engine that reports no cache hits for the pod the index says holds
// the prompt raises the drift alarm (metric, log, Quality), which clears
// once the engine agrees again.
func TestFeedbackDriftAlarm(t *testing.T) {
	clk := newFakeClock()
	ix, logs := feedbackIndexer(t, clk)
	prompt := seqTokens(1, 16*testBlock)
	apply(ix, "a", 0, storeEvent(prompt, 16, event.TierGPU))
	pod := map[string]string{"model": testModel, "pod": "a"}
	var r PickResult
	pick := func() uint64 {
		t.Helper()
		mustPick(t, ix, tokenQuery(testModel, prompt, idle("a"), idle("b")), &r)
		if r.Pod != "a" {
			t.Fatalf("picked %q", r.Pod)
		}
		return r.PickID
	}
	// The whole 64-token prompt is cached: vLLM reports 60.
	for range 20 {
		res, err := ix.Feedback(Feedback{PickID: pick(), CachedTokens: 60, PromptTokens: 64})
		if err != nil || res.PredictedTokens != 60 || res.Disagrees {
			t.Fatalf("agreeing feedback: %+v %v", res, err)
		}
	}
	if got := metricValue(t, ix, "kvindexd_feedback_alarm", pod); got != 0 {
		t.Fatalf("alarm = %v on agreeing feedback", got)
	}
	// The engine now reports nothing cached: after enough of the window
	// disagrees the alarm is raised.
	for i := range 64 {
		res, err := ix.Feedback(Feedback{PickID: pick(), CachedTokens: 0})
		if err != nil || !res.Disagrees {
			t.Fatalf("disagreeing feedback: %+v %v", res, err)
		}
		if i == 10 && metricValue(t, ix, "kvindexd_feedback_alarm", pod) != 0 {
			t.Fatal("alarm raised before half the window disagreed")
		}
	}
	if got := metricValue(t, ix, "kvindexd_feedback_alarm", pod); got != 1 {
		t.Fatalf("alarm = %v after 64 disagreeing feedbacks", got)
	}
	if got := metricValue(t, ix, "kvindexd_feedback_drift", pod); got != 1 {
		t.Fatalf("drift = %v, want 1", got)
	}
	if got := counterValue(t, ix, "kvindexd_feedback_error_tokens_total", pod); got != 64*60 {
		t.Fatalf("error tokens = %v, want %d", got, 64*60)
	}
	if !strings.Contains(logs.String(), "pick feedback drift") || !strings.Contains(logs.String(), "pod=a") {
		t.Fatalf("no drift warning in the log:\n%s", logs.String())
	}
	if q := ix.Quality(); len(q[0].Pods) == 0 || !q[0].Pods[0].Alarm || q[0].Pods[0].Hint == "" {
		t.Fatalf("Quality() does not show the alarm: %+v", q[0].Pods)
	}
	for range 64 {
		if _, err := ix.Feedback(Feedback{PickID: pick(), CachedTokens: 60}); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricValue(t, ix, "kvindexd_feedback_alarm", pod); got != 0 {
		t.Fatalf("alarm = %v after the engine agreed again", got)
	}
}

func TestFeedbackRejects(t *testing.T) {
	clk := newFakeClock()
	ix, _ := feedbackIndexer(t, clk)
	prompt := seqTokens(1, 4*testBlock)
	apply(ix, "a", 0, storeEvent(prompt, 4, event.TierGPU))
	var r PickResult
	mustPick(t, ix, tokenQuery(testModel, prompt, idle("a")), &r)
	id := r.PickID
	_, err := ix.Feedback(Feedback{CachedTokens: 4})
	wantCode(t, err, InvalidArgument)
	_, err = ix.Feedback(Feedback{PickID: id, CachedTokens: -1})
	wantCode(t, err, InvalidArgument)
	_, err = ix.Feedback(Feedback{PickID: id, CachedTokens: 20, PromptTokens: 16})
	wantCode(t, err, InvalidArgument)
	_, err = ix.Feedback(Feedback{PickID: id + 1, CachedTokens: 0})
	wantCode(t, err, NotFound)
	if _, err := ix.Feedback(Feedback{PickID: id, CachedTokens: 0, PromptTokens: 17}); err != nil {
		t.Fatal(err)
	}
	_, err = ix.Feedback(Feedback{PickID: id, CachedTokens: 0}) // answered once
	wantCode(t, err, NotFound)
	if got := counterValue(t, ix, "kvindexd_feedback_rejected_total", map[string]string{"reason": "invalid"}); got != 3 {
		t.Errorf("invalid = %v", got)
	}
	if got := counterValue(t, ix, "kvindexd_feedback_rejected_total", map[string]string{"reason": "unknown_pick"}); got != 2 {
		t.Errorf("unknown = %v", got)
	}
	// the engine hashed 17 tokens where the pick hashed 16
	if got := counterValue(t, ix, "kvindexd_feedback_prompt_mismatches_total", model1); got != 1 {
		t.Errorf("prompt mismatches = %v", got)
	}

	// A pick older than the TTL is gone, counted as expired.
	mustPick(t, ix, tokenQuery(testModel, prompt, idle("a")), &r)
	clk.Advance(Options.FeedbackTTL.Default)
	_, err = ix.Feedback(Feedback{PickID: r.PickID})
	wantCode(t, err, NotFound)
	if got := counterValue(t, ix, "kvindexd_feedback_expired_total", nil); got != 1 {
		t.Errorf("expired = %v", got)
	}
}

// The pending picks are bounded by the capacity: the oldest gives way,
// counted, and the table never holds more. The default (a whole number of
// pages) and capacities that end inside a page (3, 1500) are all checked.
func TestFeedbackPendingCapacity(t *testing.T) {
	for _, capacity := range []int{int(Options.FeedbackCapacity.Default), 1500, 3, 1} {
		t.Run(strconv.Itoa(capacity), func(t *testing.T) {
			clk := newFakeClock()
			ttl := time.Minute
			q := newQuality(nil, clk.Now, slog.New(slog.DiscardHandler), capacity, ttl)
			m := q.other
			first := q.hold(clk.Now().UnixNano(), pendingPick{model: m, blockSize: 4})
			for range capacity + 9 {
				q.hold(clk.Now().UnixNano(), pendingPick{model: m, blockSize: 4})
			}
			if q.live != capacity || q.evicted != 10 {
				t.Fatalf("live %d evicted %d, want %d and 10", q.live, q.evicted, capacity)
			}
			if _, err := q.feedback(Feedback{PickID: first}); err == nil || err.Code != NotFound {
				t.Fatalf("the evicted pick was answered: %v", err)
			}
			if _, err := q.feedback(Feedback{PickID: q.nextID}); err != nil {
				t.Fatalf("the newest pick: %v", err)
			}
			// Pages, not a slot per pick, are allocated: the full ring is
			// its pages, and no more of them.
			if want := (capacity + feedbackPage - 1) / feedbackPage; len(q.pages) != want {
				t.Fatalf("%d pages, want %d", len(q.pages), want)
			}
			for i, p := range q.pages {
				if p == nil {
					t.Fatalf("page %d never allocated", i)
				}
			}
			// Still live just before the TTL, expired after it.
			clk.Advance(ttl - time.Second)
			q.mu.Lock()
			q.expire(clk.Now().UnixNano())
			q.mu.Unlock()
			if q.live != capacity-1 {
				t.Fatalf("before the TTL: live %d", q.live)
			}
			clk.Advance(2 * time.Second)
			q.mu.Lock()
			q.expire(clk.Now().UnixNano())
			q.mu.Unlock()
			if q.live != 0 || q.expired != uint64(capacity-1) {
				t.Fatalf("after the TTL: live %d expired %d", q.live, q.expired)
			}
		})
	}
}

// The (model, pod) table behind the per-pod series is bounded by
// MaxQualityPods: pods beyond it are counted, not kept.
func TestQualityPodTableIsBounded(t *testing.T) {
	clk := newFakeClock()
	ix, _ := feedbackIndexer(t, clk)
	q := ix.quality
	q.mu.Lock()
	for i := range MaxQualityPods + 5 {
		q.pod(q.other, "pod-"+strconv.Itoa(i))
	}
	n, kept := q.nPods, len(q.other.pods)
	q.mu.Unlock()
	if n != MaxQualityPods || kept != MaxQualityPods {
		t.Fatalf("pods kept %d (%d), want %d", n, kept, MaxQualityPods)
	}
	if got := counterValue(t, ix, "kvindexd_pick_quality_pods_omitted_total", nil); got != 5 {
		t.Fatalf("omitted = %v, want 5", got)
	}
	// A pick choosing one more pod still counts for its model.
	var r PickResult
	mustPick(t, ix, tokenQuery("m", seqTokens(1, 4*testBlock), idle("one-more")), &r)
	if got := counterValue(t, ix, "kvindexd_pick_quality_pods_omitted_total", nil); got != 6 {
		t.Fatalf("omitted = %v after a pick of a new pod, want 6", got)
	}
	if n, _ := histogram(t, ix, "kvindexd_pick_cached_share", OtherModel); n != 1 {
		t.Fatalf("the model's picks = %d", n)
	}
}
