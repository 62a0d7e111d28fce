package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// echoChat "renders" a chat as the bytes of its compacted messages JSON
// (the real renderer is tested in chatprompt and end to end in the daemon);
// messages containing "RAISE" make the template raise, model "no-template"
// has none. It records the last request for option checks.
type echoChat struct{ last *chattemplate.Request }

func (e *echoChat) TokenizeChat(_ context.Context, model string, req *chattemplate.Request, _ bool) (chattemplate.Tokens, error) {
	e.last = req
	if model == "no-template" {
		return chattemplate.Tokens{}, chattemplate.ErrNoTemplate
	}
	if bytes.Contains(req.Messages, []byte("RAISE")) {
		return chattemplate.Tokens{}, &chattemplate.RequestError{Err: errors.New("Conversation roles must alternate user/assistant")}
	}
	// "image_url" stands for a media part: the ids stop before it.
	if at := bytes.Index(req.Messages, []byte(`{"type":"image_url"`)); at >= 0 {
		return chattemplate.Tokens{IDs: rawIDs(req.Messages[:at]), Unscored: chattemplate.UnscoredMedia}, nil
	}
	return chattemplate.Tokens{IDs: echoIDs(req.Messages)}, nil
}

// rawIDs are the bytes of b as ids, uncompacted.
func rawIDs(b []byte) []uint32 {
	out := make([]uint32, len(b))
	for i, c := range b {
		out[i] = uint32(c)
	}
	return out
}

func echoIDs(messages []byte) []uint32 {
	var b bytes.Buffer
	_ = json.Compact(&b, messages)
	out := make([]uint32, b.Len())
	for i, c := range b.Bytes() {
		out[i] = uint32(c)
	}
	return out
}

func TestScoreMessagesBothTransports(t *testing.T) {
	chat := &echoChat{}
	st := newStackWith(t, indexer.Config{Keys: testKeys, Chat: chat, Tokenizer: echoPrompt{}})
	msgs := `[{"role":"user","content":"what does a KV cache hold, and for how long?"}]`
	ids := echoIDs([]byte(msgs))
	full := len(ids) / testBlock
	st.store("pod-a", 0, event.TierGPU, ids, full, blockkeys.RequestExtras{})
	st.store("pod-b", 0, event.TierGPU, ids, 3, blockkeys.RequestExtras{})
	idsJSON, _ := json.Marshal(ids)
	want := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(idsJSON) + `}`))
	if !strings.Contains(want, "pod-a:"+itoa(full)+"/") {
		t.Fatalf("token ids score %s: fixture broken", want)
	}

	chatOpts := `"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false`
	bodies := map[string]string{
		"messages":      `{"model":"` + testModel + `","messages":` + msgs + `,` + chatOpts + `}`,
		"chat body":     `{"model":"` + testModel + `","request":{"model":"` + testModel + `","messages":` + msgs + `,` + chatOpts + `,"temperature":0,"stream":true}}`,
		"model in body": `{"request":{"model":"` + testModel + `","messages":` + msgs + `,` + chatOpts + `}}`,
	}
	for name, body := range bodies {
		if got := summaryHTTP(st.scoreHTTP(body)); got != want {
			t.Errorf("HTTP %s:\n got %s\nwant %s", name, got, want)
		}
		if string(chat.last.Tools) != `[{"type":"function","function":{"name":"f"}}]` || *chat.last.AddGenerationPrompt ||
			string(chat.last.ChatTemplateKwargs) != `{"enable_thinking":false}` {
			t.Errorf("HTTP %s: options not passed: %+v", name, chat.last)
		}
	}
	ctx := context.Background()
	for name, req := range map[string]*kvindexv1.ScoreRequest{
		"chat_json": {Model: testModel, Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `,` + chatOpts + `}`}},
		"openai_request_json": {Model: testModel, Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{
			OpenaiRequestJson: `{"model":"` + testModel + `","messages":` + msgs + `,` + chatOpts + `}`}},
	} {
		resp, err := st.grpc.Score(ctx, req)
		if err != nil {
			t.Fatalf("gRPC %s: %v", name, err)
		}
		if got := summaryGRPC(resp); got != want {
			t.Errorf("gRPC %s:\n got %s\nwant %s", name, got, want)
		}
	}
	// A completions body: a prompt string and token ids.
	prompt := string(bytes.Repeat([]byte("abcd"), 10))
	st.store("pod-c", 0, event.TierGPU, echoPrompt{}.ids(prompt), 10, blockkeys.RequestExtras{})
	for _, body := range []string{
		`{"model":"` + testModel + `","request":{"model":"` + testModel + `","prompt":"` + prompt + `","max_tokens":5}}`,
		`{"model":"` + testModel + `","request":{"prompt":["` + prompt + `"]}}`,
	} {
		if got := summaryHTTP(st.scoreHTTP(body)); !strings.HasPrefix(got, "total=10 pod-c:10/") {
			t.Errorf("completions %s: %s", body, got)
		}
	}
	resp, err := st.grpc.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{"prompt":` + string(idsJSON) + `}`}})
	if err != nil || summaryGRPC(resp) != want {
		t.Errorf("gRPC completions token ids: %v %v", resp, err)
	}
}

// TestScoreMessagesWithMediaBothTransports: a chat request with an image is
// scored up to its first media item, and both transports say why the rest
// was not ("unscored_reason": "media"); a text-only answer has no such field.
func TestScoreMessagesWithMediaBothTransports(t *testing.T) {
	chat := &echoChat{}
	st := newStackWith(t, indexer.Config{Keys: testKeys, Chat: chat})
	text := `[{"role":"user","content":[{"type":"text","text":"what is in this long enough picture description request?"},`
	msgs := text + `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]`
	prefix := rawIDs([]byte(text))
	full := len(prefix) / testBlock
	st.store("pod-a", 0, event.TierGPU, prefix, full, blockkeys.RequestExtras{})
	want := "total=" + itoa(full) + " pod-a:" + itoa(full) + "/"
	code, b := st.post("/v1/score", `{"model":"`+testModel+`","messages":`+msgs+`}`)
	if code != http.StatusOK || !strings.Contains(string(b), `"unscored_reason":"media"`) {
		t.Fatalf("HTTP: %d %s", code, b)
	}
	if got := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","request":{"messages":` + msgs + `}}`)); !strings.HasPrefix(got, want) {
		t.Errorf("HTTP request body: %s, want %s...", got, want)
	}
	for name, req := range map[string]*kvindexv1.ScoreRequest{
		"chat_json": {Model: testModel, Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `}`}},
		"openai_request_json": {Model: testModel, Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{
			OpenaiRequestJson: `{"model":"` + testModel + `","messages":` + msgs + `}`}},
	} {
		resp, err := st.grpc.Score(context.Background(), req)
		if err != nil {
			t.Fatalf("gRPC %s: %v", name, err)
		}
		if got := summaryGRPC(resp); !strings.HasPrefix(got, want) || resp.GetUnscoredReason() != "media" {
			t.Errorf("gRPC %s: %s reason %q, want %s... reason media", name, got, resp.GetUnscoredReason(), want)
		}
	}
	textOnly := `[{"role":"user","content":"no media here"}]`
	if code, b := st.post("/v1/score", `{"model":"`+testModel+`","messages":`+textOnly+`}`); code != http.StatusOK || strings.Contains(string(b), "unscored_reason") {
		t.Errorf("text only: %d %s", code, b)
	}
	// reasoning_effort reaches the renderer from both HTTP body shapes.
	for _, body := range []string{
		`{"model":"` + testModel + `","messages":` + textOnly + `,"reasoning_effort":"low"}`,
		`{"model":"` + testModel + `","request":{"messages":` + textOnly + `,"reasoning_effort":"low"}}`,
	} {
		chat.last = nil
		if code, b := st.post("/v1/score", body); code != http.StatusOK || chat.last == nil || chat.last.ReasoningEffort == nil || *chat.last.ReasoningEffort != "low" {
			t.Errorf("%s: %d %s, renderer got %+v", body, code, b, chat.last)
		}
	}
}

// echoPrompt tokenizes a prompt as its bytes.
type echoPrompt struct{}

func (echoPrompt) ids(p string) []uint32 {
	out := make([]uint32, len(p))
	for i := range p {
		out[i] = uint32(p[i])
	}
	return out
}

func (e echoPrompt) TokenizePrompt(_ context.Context, _, p string) ([]uint32, error) {
	return e.ids(p), nil
}

// TokenizeRendered: echoPrompt adds no special tokens either way.
func (e echoPrompt) TokenizeRendered(_ context.Context, _, p string) ([]uint32, error) {
	return e.ids(p), nil
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestScoreMessagesErrors(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys, Chat: &echoChat{}})
	msgs := `[{"role":"user","content":"hi"}]`
	cases := []struct {
		body   string
		status int
		want   string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"RAISE"}]}`, http.StatusBadRequest, "Conversation roles must alternate"},
		{`{"model":"no-template","messages":` + msgs + `}`, http.StatusUnprocessableEntity, "no chat template"},
		{`{"model":"m","request":{"messages":` + msgs + `,"chat_template":"{{ x }}"}}`, http.StatusUnprocessableEntity, "chat_template"},
		{`{"model":"m","messages":` + msgs + `,"prompt":"x"}`, http.StatusBadRequest, "exactly one"},
		{`{"model":"m","request":{"messages":` + msgs + `},"prompt":"x"}`, http.StatusBadRequest, "no other input"},
		{`{"model":"m","tools":[]}`, http.StatusBadRequest, "apply to messages only"},
		{`{"model":"m","messages":[{"role":"user",}]}`, http.StatusBadRequest, "messages: invalid JSON"},
		{`{"model":"m","messages":` + msgs + `,"add_generation_prompt":"yes"}`, http.StatusBadRequest, "expected true, false or null"},
		{`{"model":"m","request":{"prompt":["a","b"]}}`, http.StatusBadRequest, "one request at a time"},
		{`{"model":"m","request":"text"}`, http.StatusBadRequest, "not an OpenAI request object"},
	}
	for _, c := range cases {
		code, b := st.post("/v1/score", c.body)
		if code != c.status || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %d %s, want %d containing %q", c.body, code, b, c.status, c.want)
		}
	}
	ctx := context.Background()
	for _, c := range []struct {
		req  *kvindexv1.ScoreRequest
		code codes.Code
	}{
		{&kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":[{"role":"user","content":"RAISE"}]}`}}, codes.InvalidArgument},
		{&kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `,"add_generation":true}`}}, codes.InvalidArgument},
		{&kvindexv1.ScoreRequest{Model: "no-template", Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `}`}}, codes.FailedPrecondition},
		{&kvindexv1.ScoreRequest{Model: "m", Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{}`}}, codes.InvalidArgument},
	} {
		_, err := st.grpc.Score(ctx, c.req)
		if status.Code(err) != c.code {
			t.Errorf("%v: got %v, want %v", c.req, err, c.code)
		}
	}
}

func TestModelsListsPredictions(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys, Prediction: indexer.PredictionConfig{SampleRate: 1}})
	tokens := seqTokens(10, 6*testBlock)
	st.store("pod-a", 0, event.TierGPU, tokens, 2, blockkeys.RequestExtras{})
	ids, _ := json.Marshal(tokens)
	st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `}`)
	st.store("pod-a", 0, event.TierGPU, tokens, 5, blockkeys.RequestExtras{})
	resp, err := http.Get(st.http.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		PredictionEnabled bool        `json:"prediction_enabled"`
		Models            []ModelInfo `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	want := PredictionStats{Predicted: 4, Seen: 3, Pending: 1}
	if !out.PredictionEnabled || len(out.Models) != 1 || out.Models[0].Model != testModel || out.Models[0].Prediction != want {
		t.Fatalf("GET /v1/models: %+v, want %s with %+v", out, testModel, want)
	}
}

// A chat goes through Pick exactly as through Score: the pod holding the
// rendered chat's blocks wins, over HTTP (messages, router body) and gRPC
// (chat_json, openai_request_json); a template error keeps its code.
func TestPickMessagesBothTransports(t *testing.T) {
	chat := &echoChat{}
	st := newStackWith(t, indexer.Config{Keys: testKeys, Chat: chat, Tokenizer: echoPrompt{}})
	msgs := `[{"role":"user","content":"which pod holds this conversation's prefix?"}]`
	ids := echoIDs([]byte(msgs))
	st.store("pod-b", 0, event.TierGPU, ids, len(ids)/testBlock, blockkeys.RequestExtras{})
	cands := `"candidates":[{"pod":"pod-a","running":1},{"pod":"pod-b","running":1}]`
	for name, body := range map[string]string{
		"messages": `{"model":"` + testModel + `","messages":` + msgs + `,` + cands + `}`,
		"request":  `{"model":"` + testModel + `","request":{"model":"` + testModel + `","messages":` + msgs + `},` + cands + `}`,
	} {
		resp, err := http.Post(st.http.URL+"/v1/pick", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Pod string }
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || got.Pod != "pod-b" {
			t.Errorf("HTTP pick %s: %d %+v %v, want pod-b", name, resp.StatusCode, got, err)
		}
	}
	grpcCands := []*kvindexv1.Candidate{{Pod: "pod-a", Running: 1}, {Pod: "pod-b", Running: 1}}
	for name, req := range map[string]*kvindexv1.PickRequest{
		"chat_json": {Model: testModel, Candidates: grpcCands,
			Input: &kvindexv1.PickRequest_ChatJson{ChatJson: `{"messages":` + msgs + `}`}},
		"openai_request_json": {Model: testModel, Candidates: grpcCands,
			Input: &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: `{"messages":` + msgs + `}`}},
	} {
		resp, err := st.grpc.Pick(context.Background(), req)
		if err != nil || resp.GetPod() != "pod-b" {
			t.Errorf("gRPC pick %s: %v %v, want pod-b", name, resp, err)
		}
	}
	_, err := st.grpc.Pick(context.Background(), &kvindexv1.PickRequest{Model: testModel, Candidates: grpcCands,
		Input: &kvindexv1.PickRequest_ChatJson{ChatJson: `{"messages":[{"role":"user","content":"RAISE"}]}`}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("gRPC pick with a raising template: %v, want InvalidArgument", err)
	}
}
