package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// testClock is the injected clock of the pick TTLs.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newPickStack(t *testing.T) (*stack, *testClock) {
	clk := &testClock{t: time.Unix(1_700_000_000, 0)}
	return newStackWith(t, indexer.Config{Keys: testKeys, Pick: indexer.PickConfig{Now: clk.Now}}), clk
}

// pickCand is a candidate in either transport's terms.
type pickCand struct {
	Pod     string `json:"pod"`
	Running int    `json:"running,omitempty"`
	Waiting int    `json:"waiting,omitempty"`
	Events  *bool  `json:"events,omitempty"`
}

type pickAnswer struct {
	Pod        string `json:"pod"`
	DPRank     *int   `json:"dp_rank"`
	Policy     string `json:"policy"`
	Reason     string `json:"reason"`
	Candidates []struct {
		Pod               string  `json:"pod"`
		DPRank            *int    `json:"dp_rank"`
		MatchedBlocks     int     `json:"matched_blocks"`
		SpeculativeBlocks int     `json:"speculative_blocks"`
		Approximate       bool    `json:"approximate"`
		Score             float64 `json:"score"`
		Cost              float64 `json:"cost"`
	} `json:"candidates"`
}

func (a *pickAnswer) cand(pod string) (matched, spec int) {
	for _, c := range a.Candidates {
		if c.Pod == pod {
			return c.MatchedBlocks, c.SpeculativeBlocks
		}
	}
	return -1, -1
}

// transport asks Pick over HTTP or gRPC with token ids.
type transport struct {
	name string
	pick func(t *testing.T, st *stack, tokens []uint32, policy string, cands []pickCand) (pickAnswer, int, codes.Code)
}

var transports = []transport{{"http", httpPick}, {"grpc", grpcPick}}

func httpPick(t *testing.T, st *stack, tokens []uint32, policy string, cands []pickCand) (pickAnswer, int, codes.Code) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": tokens, "policy": policy, "candidates": cands})
	resp, err := http.Post(st.http.URL+"/v1/pick", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a pickAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
		return a, resp.StatusCode, codes.OK
	}
	var e struct{ Error, Code string }
	_ = json.Unmarshal(raw, &e)
	c := codes.Unknown
	_ = c.UnmarshalJSON([]byte(`"` + strings.ToUpper(snake(e.Code)) + `"`))
	return a, resp.StatusCode, c
}

// snake turns "InvalidArgument" into "INVALID_ARGUMENT" for codes.Code.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func grpcPick(t *testing.T, st *stack, tokens []uint32, policy string, cands []pickCand) (pickAnswer, int, codes.Code) {
	t.Helper()
	req := &kvindexv1.PickRequest{Model: testModel, Input: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: tokens}}, Policy: policy}
	for _, c := range cands {
		req.Candidates = append(req.Candidates, &kvindexv1.Candidate{Pod: c.Pod, Running: int32(c.Running), Waiting: int32(c.Waiting), Events: c.Events})
	}
	resp, err := st.grpc.Pick(context.Background(), req)
	if err != nil {
		return pickAnswer{}, 0, status.Code(err)
	}
	a := pickAnswer{Pod: resp.Pod, Policy: resp.Policy, Reason: resp.Reason}
	if resp.DpRank != nil {
		r := int(*resp.DpRank)
		a.DPRank = &r
	}
	for _, c := range resp.Candidates {
		a.Candidates = append(a.Candidates, struct {
			Pod               string  `json:"pod"`
			DPRank            *int    `json:"dp_rank"`
			MatchedBlocks     int     `json:"matched_blocks"`
			SpeculativeBlocks int     `json:"speculative_blocks"`
			Approximate       bool    `json:"approximate"`
			Score             float64 `json:"score"`
			Cost              float64 `json:"cost"`
		}{Pod: c.Pod, MatchedBlocks: int(c.MatchedBlocks), SpeculativeBlocks: int(c.SpeculativeBlocks), Approximate: c.Approximate,
			Score: c.Score, Cost: c.Cost})
	}
	return a, http.StatusOK, codes.OK
}

func mustPickOK(t *testing.T, tr transport, st *stack, tokens []uint32, policy string, cands ...pickCand) pickAnswer {
	t.Helper()
	a, httpCode, c := tr.pick(t, st, tokens, policy, cands)
	if c != codes.OK || httpCode != http.StatusOK {
		t.Fatalf("%s: pick failed: %d %v", tr.name, httpCode, c)
	}
	return a
}

var yes, no = func() *bool { b := true; return &b }(), func() *bool { b := false; return &b }()

func TestPickE2EEqualLoadLongestPrefixWins(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st, _ := newPickStack(t)
			prompt := seqTokens(1, 16*testBlock)
			st.store("a", 0, event.TierGPU, prompt, 4, blockkeys.RequestExtras{})
			st.store("b", 0, event.TierGPU, prompt, 12, blockkeys.RequestExtras{})
			st.store("c", 0, event.TierGPU, prompt, 8, blockkeys.RequestExtras{})
			for _, pol := range []string{"", "cost", "weighted", "aibrix", "sglang", "guarded-prefix"} {
				a := mustPickOK(t, tr, st, prompt, pol, pickCand{Pod: "a", Running: 2}, pickCand{Pod: "b", Running: 2},
					pickCand{Pod: "c", Running: 2}, pickCand{Pod: "fresh", Running: 2, Events: yes})
				if a.Pod != "b" {
					t.Errorf("policy %q: picked %q (%s), want b", pol, a.Pod, a.Reason)
				}
				if m, _ := a.cand("c"); m != 8 {
					t.Errorf("policy %q: c matched %d", pol, m)
				}
				if pol == "" && a.Policy != "sglang" {
					t.Errorf("default policy = %q", a.Policy)
				}
			}
		})
	}
}

// The cost model's documented threshold: a holder of all 16 blocks costs
// 16 per request in flight, an idle pod 16 + 16; the holder keeps the
// request with one in flight and loses it with three.
func TestPickE2ELoadedHolderLosesToIdlePod(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st, _ := newPickStack(t)
			prompt := seqTokens(1, 16*testBlock)
			st.store("hot", 0, event.TierGPU, prompt, 16, blockkeys.RequestExtras{})
			a := mustPickOK(t, tr, st, prompt, "cost", pickCand{Pod: "hot", Running: 1}, pickCand{Pod: "idle", Events: yes})
			if a.Pod != "hot" {
				t.Fatalf("lightly loaded holder lost: %+v", a)
			}
			a = mustPickOK(t, tr, st, prompt, "cost", pickCand{Pod: "hot", Running: 3}, pickCand{Pod: "idle2", Events: yes})
			if a.Pod != "idle2" || a.Reason != "lowest-cost" || a.Candidates[0].Cost != 48 || a.Candidates[1].Cost != 32 {
				t.Fatalf("busy holder kept the request: %+v", a)
			}
			// AIBrix: a running spread above 16 ignores the prefix.
			a = mustPickOK(t, tr, st, prompt, "aibrix", pickCand{Pod: "hot", Running: 17}, pickCand{Pod: "idle3", Events: yes})
			if a.Pod != "idle3" || a.Reason != "load-imbalanced" {
				t.Fatalf("aibrix: %+v", a)
			}
		})
	}
}

// Two identical requests picked back to back, no events in between: the
// second goes to the first's pod and reports its blocks as speculative;
// after the TTL with no event, they are gone.
func TestPickE2ESpeculativeBackToBackAndTTL(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st, clk := newPickStack(t)
			prompt := seqTokens(50, 10*testBlock)
			cands := []pickCand{{Pod: "p0", Events: yes}, {Pod: "p1", Events: yes}, {Pod: "p2", Events: yes}}
			first := mustPickOK(t, tr, st, prompt, "", cands...)
			for i := range cands {
				if cands[i].Pod == first.Pod {
					cands[i].Running = 1 // the router now counts the first request
				}
			}
			second := mustPickOK(t, tr, st, prompt, "", cands...)
			if second.Pod != first.Pod {
				t.Fatalf("second identical request went to %s, first to %s", second.Pod, first.Pod)
			}
			if m, s := second.cand(first.Pod); m != 10 || s != 10 {
				t.Fatalf("second pick: matched %d speculative %d, want 10 10", m, s)
			}
			clk.Advance(2*time.Second + time.Millisecond)
			third := mustPickOK(t, tr, st, prompt, "", cands...)
			if m, s := third.cand(first.Pod); m != 0 || s != 0 {
				t.Fatalf("after the TTL: matched %d speculative %d", m, s)
			}
		})
	}
}

func TestPickE2ECandidateWithoutEventsWins(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st, clk := newPickStack(t)
			prompt := seqTokens(7, 12*testBlock)
			st.store("evented", 0, event.TierGPU, seqTokens(900, 12*testBlock), 12, blockkeys.RequestExtras{})
			a := mustPickOK(t, tr, st, prompt, "", pickCand{Pod: "evented", Running: 1}, pickCand{Pod: "silent", Events: no})
			if a.Pod != "silent" {
				t.Fatalf("first: %+v", a)
			}
			clk.Advance(10 * time.Second)
			a = mustPickOK(t, tr, st, prompt, "", pickCand{Pod: "evented", Running: 1}, pickCand{Pod: "silent", Running: 1, Events: no})
			if m, _ := a.cand("silent"); a.Pod != "silent" || m != 12 || !a.Candidates[1].Approximate {
				t.Fatalf("second: %+v", a)
			}
		})
	}
}

func TestPickE2EInvalid(t *testing.T) {
	st, _ := newPickStack(t)
	prompt := seqTokens(1, 8)
	for _, tr := range transports {
		for name, cands := range map[string][]pickCand{
			"no candidates": nil,
			"empty pod":     {{Pod: ""}},
			"negative":      {{Pod: "a", Running: -1}},
			"duplicate":     {{Pod: "a"}, {Pod: "a"}},
		} {
			_, httpCode, c := tr.pick(t, st, prompt, "", cands)
			if c != codes.InvalidArgument || (tr.name == "http" && httpCode != http.StatusBadRequest) {
				t.Errorf("%s %s: got %d %v", tr.name, name, httpCode, c)
			}
		}
		if _, _, c := tr.pick(t, st, prompt, "nope", []pickCand{{Pod: "a"}}); c != codes.InvalidArgument {
			t.Errorf("%s unknown policy: %v", tr.name, c)
		}
	}
	// HTTP-only decoding errors.
	for _, body := range []string{
		`{"model":"m","token_ids":[1,2,3,4],"candidates":[{"pod":"a","bogus":1}]}`,
		`{"model":"m","token_ids":[1,2,3,4],"candidates":[{"pod":"a","kv_usage":"high"}]}`,
		`{"model":"m","token_ids":[1,2,3,4],"candidates":[{"pod":"a","events":"yes"}]}`,
		`{"model":"m","token_ids":[1,2,3,4],"candidates":[{"pod":"a","kv_usage":2}]}`,
		`{"model":"m","token_ids":[1,2,3,4],"prompt":"x","candidates":[{"pod":"a"}]}`,
		`{"model":"m","token_ids":[1,2,3,4],"candidates":[{"pod":"a","running":99999999999}]}`,
	} {
		resp, err := http.Post(st.http.URL+"/v1/pick", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s", body, resp.StatusCode, raw)
		}
	}
	// Metrics count both transports' requests by code.
	text := scrape(t, st)
	for _, want := range []string{`kvindexd_pick_requests_total{code="InvalidArgument"}`, "kvindexd_pick_duration_seconds_count"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestPickE2EMetricsAndDPRank(t *testing.T) {
	st, _ := newPickStack(t)
	prompt := seqTokens(1, 8*testBlock)
	st.store("dp", 3, event.TierGPU, prompt, 8, blockkeys.RequestExtras{})
	body := `{"model":"` + testModel + `","token_ids":` + fmt.Sprint(jsonInts(prompt)) + `,"candidates":[{"pod":"dp","kv_usage":0.5,"events":null,"dp_rank":null},{"pod":"x","dp_rank":0,"waiting":2}]}`
	resp, err := http.Post(st.http.URL+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var a pickAnswer
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(raw, &a); err != nil || a.Pod != "dp" || a.DPRank == nil || *a.DPRank != 3 || a.Candidates[1].DPRank == nil {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	if text := scrape(t, st); !strings.Contains(text, `kvindexd_picks_total{policy="sglang",reason="best-prefix"} 1`) {
		t.Errorf("picks metric missing")
	}
}

func jsonInts(v []uint32) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func scrape(t *testing.T, st *stack) string {
	t.Helper()
	resp, err := http.Get(st.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}
