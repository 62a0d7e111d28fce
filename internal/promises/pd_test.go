package promises

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// pdCand is one candidate of a P/D pick: pod, role ("" = none sent) and
// KV usage (the default policy, sglang, breaks a no-match by it).
type pdCand struct {
	pod, role string
	kv        float64
}

// pdFleet: two prefill and two decode pods, dc-1 with the most free cache.
var pdFleet = []pdCand{{"pf-1", "prefill", 0.2}, {"pf-2", "prefill", 0.3}, {"dc-1", "decode", 0.1}, {"dc-2", "decode", 0.5}}

// pdAnswer is what the scenarios check of a pick answer, read the same way
// from HTTP and gRPC.
type pdAnswer struct {
	Pod            string
	PD             bool // the answer has the P/D fields
	Decision       string
	NonCached      int
	PrefillPod     string
	PrefillReason  string
	PrefillMatched int
	Source         string
	SourceBlocks   int
	SourceExtra    int
	SourceCand     string // "none" for a pod the router did not offer
	Spec           map[string]int
	Matched        map[string]int
	Roles          map[string]string
}

// pdPicker runs one pick of tokens over cands.
type pdPicker func(t *testing.T, tokens []uint32, cands []pdCand) pdAnswer

func httpPD(d *harness.Daemon) pdPicker {
	return func(t *testing.T, tokens []uint32, cands []pdCand) pdAnswer {
		t.Helper()
		body := pdHTTPBody(tokens, cands)
		code, resp, _ := d.Do("POST", "/v1/pick", body)
		if code != http.StatusOK {
			t.Fatalf("/v1/pick: %d %s", code, resp)
		}
		var r struct {
			Pod            string `json:"pod"`
			Disaggregation *struct {
				Decision        string `json:"decision"`
				NonCachedTokens int    `json:"non_cached_tokens"`
			} `json:"disaggregation"`
			PrefillPod *struct {
				Pod           string `json:"pod"`
				Reason        string `json:"reason"`
				MatchedBlocks int    `json:"matched_blocks"`
			} `json:"prefill_pod"`
			KVSource *struct {
				Pod         string `json:"pod"`
				Candidate   *int   `json:"candidate"`
				Blocks      int    `json:"blocks"`
				ExtraBlocks int    `json:"extra_blocks"`
				Reason      string `json:"reason"`
			} `json:"kv_source"`
			Candidates []struct {
				Pod         string  `json:"pod"`
				Matched     int     `json:"matched_blocks"`
				Speculative int     `json:"speculative_blocks"`
				Role        *string `json:"role"`
			} `json:"candidates"`
		}
		if err := json.Unmarshal([]byte(resp), &r); err != nil {
			t.Fatalf("%v: %s", err, resp)
		}
		a := pdAnswer{Pod: r.Pod, Spec: map[string]int{}, Matched: map[string]int{}, Roles: map[string]string{}}
		if r.Disaggregation != nil {
			a.PD, a.Decision, a.NonCached = true, r.Disaggregation.Decision, r.Disaggregation.NonCachedTokens
		}
		if p := r.PrefillPod; p != nil {
			a.PrefillPod, a.PrefillReason, a.PrefillMatched = p.Pod, p.Reason, p.MatchedBlocks
		}
		if s := r.KVSource; s != nil {
			a.Source, a.SourceBlocks, a.SourceExtra, a.SourceCand = s.Pod, s.Blocks, s.ExtraBlocks, "none"
			if s.Candidate != nil {
				a.SourceCand = r.Candidates[*s.Candidate].Pod
			}
			if s.Reason != "holds-more-blocks" {
				t.Errorf("kv_source reason %q", s.Reason)
			}
		}
		for _, c := range r.Candidates {
			a.Spec[c.Pod], a.Matched[c.Pod] = c.Speculative, c.Matched
			if c.Role != nil {
				a.Roles[c.Pod] = *c.Role
			}
		}
		return a
	}
}

func pdHTTPBody(tokens []uint32, cands []pdCand) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"token_ids":[`, model)
	for i, tk := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, tk)
	}
	b.WriteString(`],"candidates":[`)
	for i, c := range cands {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"pod":%q,"kv_usage":%g`, c.pod, c.kv)
		if c.role != "" {
			fmt.Fprintf(&b, `,"role":%q`, c.role)
		}
		b.WriteByte('}')
	}
	b.WriteString("]}")
	return b.String()
}

func grpcPD(d *harness.Daemon) pdPicker {
	return func(t *testing.T, tokens []uint32, cands []pdCand) pdAnswer {
		t.Helper()
		g, _ := grpcClient(t, d)
		req := &kvindexv1.PickRequest{Model: model, Input: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: tokens}}}
		for _, c := range cands {
			req.Candidates = append(req.Candidates, &kvindexv1.Candidate{Pod: c.pod, KvUsage: c.kv, Role: c.role})
		}
		ctx, cancel := withToken("")
		defer cancel()
		r, err := g.Pick(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		a := pdAnswer{Pod: r.GetPod(), Spec: map[string]int{}, Matched: map[string]int{}, Roles: map[string]string{}}
		if x := r.GetDisaggregation(); x != nil {
			a.PD, a.Decision, a.NonCached = true, x.GetDecision(), int(x.GetNonCachedTokens())
		}
		if p := r.GetPrefillPod(); p != nil {
			a.PrefillPod, a.PrefillReason, a.PrefillMatched = p.GetPod(), p.GetReason(), int(p.GetMatchedBlocks())
		}
		if s := r.GetKvSource(); s != nil {
			a.Source, a.SourceBlocks, a.SourceExtra, a.SourceCand = s.GetPod(), int(s.GetBlocks()), int(s.GetExtraBlocks()), "none"
			if s.Candidate != nil {
				a.SourceCand = r.GetCandidates()[s.GetCandidate()].GetPod()
			}
			if s.GetReason() != "holds-more-blocks" {
				t.Errorf("kv_source reason %q", s.GetReason())
			}
		}
		for _, c := range r.GetCandidates() {
			a.Spec[c.GetPod()], a.Matched[c.GetPod()] = int(c.GetSpeculativeBlocks()), int(c.GetMatchedBlocks())
			if c.GetRole() != "" {
				a.Roles[c.GetPod()] = c.GetRole()
			}
		}
		return a
	}
}

// TestPromisePDPick: with events for two prefill and two decode pods (and
// one more pod no router offers), Pick over HTTP and gRPC with candidate
// roles, on the default flags (--pick-max-local-prefill-tokens 1000,
// --pick-max-prefill-waiting 2, policy sglang, block size 16):
//
//	(a) a conversation whose history is cached on a decode pod goes to that
//	    pod, prefilled locally (few tokens remain);
//	(b) a new long prompt is disaggregated to the prefill pod holding its
//	    prefix, and both pods then hold it speculatively;
//	(c) a pod holding more of the prompt than the chosen pods is named as
//	    kv_source with its block counts;
//
// and candidates without roles answer as before (no P/D field, the same
// bytes as all-"both" roles).
func TestPromisePDPick(t *testing.T) {
	t.Parallel()
	// One more decode pod reached through --endpoint with its role: /v1/pods
	// and the status page show it.
	dc9, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dc9.Close)
	d := harness.Start(t, "--endpoint", dc9.Addr()+",pod=dc-9,role=decode")
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	defer cancel()
	if err := dc9.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	publish(t, dc9, "dc-9", model, 0, stored(engineHashes(t, prompt(9, 1)), prompt(9, 1)))
	wait.Until(t, "dc-9 listed with its role", func() string {
		if p, ok := d.Pod("dc-9"); !ok || p.Role != "decode" || p.Blocks != 1 {
			return fmt.Sprintf("pod %+v", p)
		}
		return ""
	})
	pub := d.Publisher()
	seq := map[string]uint64{}
	send := func(pod string, tokens []uint32) {
		publish(t, pub, pod, model, seq[pod], stored(engineHashes(t, tokens), tokens))
		seq[pod]++
	}
	for _, tc := range []struct {
		name string
		base int // prompts distinct per transport: speculative entries persist
		pick pdPicker
	}{{"http", 10, httpPD(d)}, {"grpc", 20, grpcPD(d)}} {
		t.Run(tc.name, func(t *testing.T) {
			history := prompt(tc.base+1, 80)               // 1280 tokens on dc-2
			long := prompt(tc.base+2, 100)                 // 1600 tokens, new
			system := long[:40*blockSize]                  // its first 40 blocks, on pf-2
			third := prompt(tc.base+3, 100)                // 90 blocks on pod-x, 40 on pf-1
			turn := append(append([]uint32{}, history...), // the next turn: 2 blocks more
				prompt(tc.base+4, 2)...)
			send("dc-2", history)
			send("pf-2", system)
			send("pf-1", third[:40*blockSize])
			send("pod-x", third[:90*blockSize])
			// dc-1 publishes too (something else): a pod with events is
			// matched through the index plus speculative entries, not
			// through the routing history
			other := prompt(tc.base+5, 1)
			send("dc-1", other)
			wait.Until(t, "the events are applied", func() string {
				got := d.ScoreTokens(model, third)
				if got["pod-x"] != 90 || got["pf-1"] != 40 || d.ScoreTokens(model, history)["dc-2"] != 80 ||
					d.ScoreTokens(model, long)["pf-2"] != 40 || d.ScoreTokens(model, other)["dc-1"] != 1 {
					return fmt.Sprintf("third %v", got)
				}
				return ""
			})

			// (a) 32 tokens left on dc-2: it decodes and prefills them.
			a := tc.pick(t, turn, pdFleet)
			if a.Pod != "dc-2" || !a.PD || a.Decision != "few-uncached-tokens" || a.NonCached != 2*blockSize ||
				a.PrefillPod != "" || a.Source != "" || a.Roles["pf-1"] != "prefill" {
				t.Errorf("(a) conversation: %+v", a)
			}

			// (b) 1600 tokens, nothing on the decode pods: dc-1 (most free
			// cache) decodes, pf-2 (holds 40 of the 100 blocks) prefills.
			b := tc.pick(t, long, pdFleet)
			if b.Pod != "dc-1" || b.Decision != "disaggregated" || b.NonCached != 1600 || b.PrefillPod != "pf-2" ||
				b.PrefillMatched != 40 || b.PrefillReason != "best-prefix" || b.Source != "" {
				t.Errorf("(b) long prompt: %+v", b)
			}
			// Both pods will hold the prompt afterwards (the prefill pod
			// computed it, the decode pod cached what it received): the
			// same prompt again now stays on dc-1, prefilled locally.
			b2 := tc.pick(t, long, pdFleet)
			if b2.Pod != "dc-1" || b2.Decision != "few-uncached-tokens" || b2.Spec["dc-1"] != 100 || b2.Spec["pf-2"] != 60 {
				t.Errorf("(b) the same prompt again: %+v", b2)
			}

			// (c) pod-x, offered by no router, holds 90 blocks; the chosen
			// pair holds at most 40 (pf-1).
			c := tc.pick(t, third, pdFleet)
			if c.Pod != "dc-1" || c.PrefillPod != "pf-1" || c.Source != "pod-x" || c.SourceBlocks != 90 ||
				c.SourceExtra != 50 || c.SourceCand != "none" {
				t.Errorf("(c) kv_source: %+v", c)
			}
		})
	}

	// Without roles: no P/D field, and the bytes of all-"both" roles. The
	// request's blocks are all on the chosen pod already, so the first pick
	// adds no speculative entry that could change the second answer.
	history := prompt(31, 40)
	send("dc-2", history)
	wait.For(t, "history applied", func() bool { return d.ScoreTokens(model, history)["dc-2"] == 40 })
	var none, both []pdCand
	for _, c := range pdFleet {
		none = append(none, pdCand{pod: c.pod, kv: c.kv})
		both = append(both, pdCand{pod: c.pod, role: "both", kv: c.kv})
	}
	_, plain, _ := d.Do("POST", "/v1/pick", pdHTTPBody(history, none))
	_, asBoth, _ := d.Do("POST", "/v1/pick", pdHTTPBody(history, both))
	// Every answer has its own pick_id; the rest must be the same bytes.
	plain, asBoth = pickIDField.ReplaceAllString(plain, ""), pickIDField.ReplaceAllString(asBoth, "")
	if plain != asBoth || strings.Contains(plain, "disaggregation") || strings.Contains(plain, `"role"`) ||
		!strings.HasPrefix(plain, `{"pod":"dc-2"`) {
		t.Errorf("without roles:\n%s\nall both:\n%s", plain, asBoth)
	}
	if a := grpcPD(d)(t, history, none); a.PD || a.Pod != "dc-2" || len(a.Roles) != 0 {
		t.Errorf("gRPC without roles: %+v", a)
	}

	// A role nobody knows is a 400 with the reason; a fleet that cannot
	// decode is one too.
	code, body, _ := d.Do("POST", "/v1/pick", pdHTTPBody(history, []pdCand{{pod: "pf-1", role: "prefiller"}}))
	if code != http.StatusBadRequest || !strings.Contains(body, `unknown role \"prefiller\"`) {
		t.Errorf("unknown role: %d %s", code, body)
	}
	code, body, _ = d.Do("POST", "/v1/pick", pdHTTPBody(history, []pdCand{{pod: "pf-1", role: "prefill"}}))
	if code != http.StatusBadRequest || !strings.Contains(body, "no candidate can decode") {
		t.Errorf("prefill pods only: %d %s", code, body)
	}
	if v := d.Metric(`kvindexd_pick_pd_total{decision="disaggregated"}`); v != 4 {
		t.Errorf("kvindexd_pick_pd_total{decision=disaggregated} = %v, want 4", v)
	}
	if v := d.Metric("kvindexd_pick_kv_sources_total"); v != 2 {
		t.Errorf("kvindexd_pick_kv_sources_total = %v, want 2", v)
	}
}

// pickIDField matches the pick_id member of a Pick answer.
var pickIDField = regexp.MustCompile(`"pick_id":"[0-9a-f]{16}",`)
