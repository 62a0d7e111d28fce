package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// slowRender is echoChat that reports a render time, as chatprompt's
// renderer does, so the render stage can be told from tokenize.
type slowRender struct{ echoChat }

const fakeRender = 3 * time.Millisecond

func (s *slowRender) TokenizeChat(ctx context.Context, model string, req *chattemplate.Request, add bool) (chattemplate.Tokens, error) {
	t, err := s.echoChat.TokenizeChat(ctx, model, req, add)
	t.Rendered = fakeRender
	return t, err
}

// stageSeries reads kvindexd_request_stage_seconds' count and sum per
// "op/stage" from /metrics.
func (st *stack) stageSeries() (count map[string]int, sum map[string]float64) {
	st.t.Helper()
	resp, err := http.Get(st.http.URL + "/metrics")
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	count, sum = map[string]int{}, map[string]float64{}
	re := regexp.MustCompile(`(?m)^kvindexd_request_stage_seconds_(count|sum)\{op="(\w+)",stage="(\w+)"\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[4], 64)
		if m[1] == "count" {
			count[m[2]+"/"+m[3]] = int(v)
		} else {
			sum[m[2]+"/"+m[3]] = v
		}
	}
	return count, sum
}

// Every stage of score and pick is observed once per request that reaches
// it, over both transports: parse and encode by the transport, render,
// tokenize, keys, lookup and policy by the indexer. A chat request's render
// is the renderer's measured time, apart from tokenize.
func TestStageHistograms(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys, Chat: &slowRender{}, Tokenizer: echoPrompt{}})
	ids := echoPrompt{}.ids("a prompt long enough for two blocks of sixteen ids each, and more")
	st.store("pod-a", 0, event.TierGPU, ids, 2, blockkeys.RequestExtras{})
	count0, _ := st.stageSeries()
	if len(count0) != 13 {
		t.Fatalf("%d stage series before any request, want 13 (7 pick, 6 score: no score policy): %v", len(count0), count0)
	}
	msgs := `[{"role":"user","content":"what does a KV cache hold, and for how long?"}]`
	st.scoreHTTP(`{"model":"` + testModel + `","messages":` + msgs + `}`)
	st.scoreHTTP(`{"model":"` + testModel + `","prompt":"a prompt long enough for two blocks of sixteen ids each, and more"}`)
	if code, b := st.post("/v1/pick", `{"model":"`+testModel+`","prompt":"a prompt long enough for two blocks of sixteen ids each, and more","candidates":[{"pod":"pod-a"},{"pod":"pod-b"}]}`); code != http.StatusOK {
		t.Fatalf("pick: %d %s", code, b)
	}
	ctx := context.Background()
	if _, err := st.grpc.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: ids}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.grpc.Pick(ctx, &kvindexv1.PickRequest{Model: testModel,
		Input:      &kvindexv1.PickRequest_ChatJson{ChatJson: `{"messages":` + msgs + `}`},
		Candidates: []*kvindexv1.Candidate{{Pod: "pod-a"}}}); err != nil {
		t.Fatal(err)
	}
	// A request refused while parsing counts in no stage.
	if code, _ := st.post("/v1/score", `{"model":`); code != http.StatusBadRequest {
		t.Fatalf("bad body: %d", code)
	}

	count, sum := st.stageSeries()
	want := map[string]int{
		// score: HTTP messages, HTTP prompt, gRPC token ids
		"score/parse": 3, "score/render": 1, "score/tokenize": 2, "score/keys": 3, "score/lookup": 3, "score/encode": 3,
		// pick: HTTP prompt, gRPC chat
		"pick/parse": 2, "pick/render": 1, "pick/tokenize": 2, "pick/keys": 2, "pick/lookup": 2, "pick/policy": 2, "pick/encode": 2,
	}
	for k, n := range want {
		if got := count[k] - count0[k]; got != n {
			t.Errorf("%s: %d observations, want %d", k, got, n)
		}
	}
	if _, ok := count["score/policy"]; ok {
		t.Errorf("score has a policy series")
	}
	for _, k := range []string{"score/render", "pick/render"} {
		if s := sum[k]; s < fakeRender.Seconds() || s > 2*fakeRender.Seconds() {
			t.Errorf("%s sum %v, want the renderer's %v", k, s, fakeRender)
		}
	}
	if s := sum["score/tokenize"]; s >= fakeRender.Seconds() {
		t.Errorf("score/tokenize sum %v holds the render time", s)
	}
	if t.Failed() {
		t.Log(fmt.Sprint(count))
	}
}
