package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// fakeChat "renders" a chat as the bytes of its messages JSON, with one
// marker token in front when special tokens are added, and records what it
// was asked.
type fakeChat struct {
	err        error
	addSpecial bool
	req        *chattemplate.Request
	unscored   string
}

func (f *fakeChat) TokenizeChat(_ context.Context, _ string, req *chattemplate.Request, addSpecial bool) (chattemplate.Tokens, error) {
	f.req, f.addSpecial = req, addSpecial
	if f.err != nil {
		return chattemplate.Tokens{}, f.err
	}
	var out []uint32
	if addSpecial {
		out = append(out, 1)
	}
	for _, b := range req.Messages {
		out = append(out, uint32(b))
	}
	return chattemplate.Tokens{IDs: out, Unscored: f.unscored}, nil
}

func chatIDs(messages string) []uint32 {
	var out []uint32
	for _, b := range []byte(messages) {
		out = append(out, uint32(b))
	}
	return out
}

func TestScoreMessages(t *testing.T) {
	fc := &fakeChat{}
	ix := newTestIndexer(t, Config{Chat: fc, Tokenizer: fakeTokenizer{}})
	msgs := `[{"role":"user","content":"hello there, a long enough message"}]`
	ids := chatIDs(msgs)
	apply(ix, "pod-a", 0, storeEvent(ids, len(ids)/testBlock, event.TierGPU))
	var r Result
	q := Query{Model: testModel, Kind: InputMessages, Chat: &chattemplate.Request{Messages: json.RawMessage(msgs)}}
	full := len(ids) / testBlock
	if got := mustScore(t, ix, &q, &r); r.TotalBlocks != full || len(r.Pods) != 1 || r.Pods[0].MatchedBlocks != full {
		t.Fatalf("messages: %s, want all %d blocks on pod-a", got, full)
	}
	if fc.addSpecial {
		t.Fatal("chat tokenized with special tokens by default")
	}
	if r.UnscoredReason != "" {
		t.Fatalf("text-only chat: unscored reason %q", r.UnscoredReason)
	}
	// A chat cut at its first media item: its blocks are scored, the reason
	// for the rest is reported, and a reused Result forgets it.
	fc.unscored = chattemplate.UnscoredMedia
	mustScore(t, ix, &q, &r)
	if r.UnscoredReason != "media" || r.TotalBlocks != full || len(r.Pods) != 1 || r.Pods[0].MatchedBlocks != full {
		t.Fatalf("media: %s, reason %q", summary(&r), r.UnscoredReason)
	}
	fc.unscored = ""
	mustScore(t, ix, &q, &r)
	if r.UnscoredReason != "" {
		t.Fatalf("reused result kept the reason %q", r.UnscoredReason)
	}
	yes := true
	q.AddSpecialTokens = &yes
	mustScore(t, ix, &q, &r)
	if !fc.addSpecial || len(r.Pods) != 0 {
		t.Fatalf("add_special_tokens=true: addSpecial=%v, %s", fc.addSpecial, summary(&r))
	}

	// Errors: the template's refusal is the request's fault (400), anything
	// else is this daemon's configuration (422).
	for _, c := range []struct {
		err  error
		code Code
	}{
		{&chattemplate.RequestError{Err: errors.New("Conversation roles must alternate")}, InvalidArgument},
		{chattemplate.ErrNoTemplate, FailedPrecondition},
	} {
		fc.err = c.err
		err := ix.Score(context.Background(), &Query{Model: testModel, Kind: InputMessages, Chat: q.Chat}, &r)
		var ie *Error
		if !errors.As(err, &ie) || ie.Code != c.code || !strings.Contains(ie.Msg, c.err.Error()) {
			t.Errorf("%v: got %v", c.err, err)
		}
	}
	fc.err = nil
	for _, bad := range []Query{
		{Model: testModel, Kind: InputMessages},
		{Model: testModel, Kind: InputMessages, Chat: &chattemplate.Request{Messages: json.RawMessage("null")}},
		{Kind: InputMessages, Chat: q.Chat},
		{Model: testModel, Kind: InputTokens, TokenIDs: ids, AddSpecialTokens: &yes},
	} {
		var ie *Error
		if err := ix.Score(context.Background(), &bad, &r); !errors.As(err, &ie) || ie.Code != InvalidArgument {
			t.Errorf("%+v: got %v, want InvalidArgument", bad, err)
		}
	}
	none := newTestIndexer(t, Config{})
	var ie *Error
	if err := none.Score(context.Background(), &q, &r); !errors.As(err, &ie) || ie.Code != FailedPrecondition {
		t.Errorf("no chat tokenizer: %v", err)
	}
}

func TestSetOpenAIRequest(t *testing.T) {
	yes, no := true, false
	cases := []struct {
		name, outer, body string
		want              Query
		chat              *chattemplate.Request
		code              Code
	}{
		{name: "chat with options", outer: "base", body: `{"model":"base","messages":[{"role":"user","content":"hi"}],
			"tools":[{"type":"function"}],"documents":[{"t":1}],"add_generation_prompt":false,"continue_final_message":true,
			"chat_template_kwargs":{"enable_thinking":false},"cache_salt":"s1","temperature":0.2,"stream":true}`,
			want: Query{Model: "base", Kind: InputMessages, CacheSalt: "s1"},
			chat: &chattemplate.Request{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`), Tools: json.RawMessage(`[{"type":"function"}]`),
				Documents: json.RawMessage(`[{"t":1}]`), AddGenerationPrompt: &no, ContinueFinalMessage: true,
				ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`)}},
		{name: "lora by model name", outer: "base", body: `{"model":"sql-adapter","messages":[{"role":"user","content":"hi"}],"add_special_tokens":true}`,
			want: Query{Model: "base", Kind: InputMessages, LoraName: "sql-adapter", AddSpecialTokens: &yes},
			chat: &chattemplate.Request{Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)}},
		{name: "model from body", body: `{"model":"m","prompt":"text"}`, want: Query{Model: "m", Kind: InputPrompt, Prompt: "text"}},
		{name: "prompt list of one", outer: "m", body: `{"prompt":["text"],"add_special_tokens":false}`,
			want: Query{Model: "m", Kind: InputPrompt, Prompt: "text", AddSpecialTokens: &no}},
		{name: "token ids", outer: "m", body: `{"prompt":[1,2,3],"add_special_tokens":false}`, want: Query{Model: "m", Kind: InputTokens, TokenIDs: []uint32{1, 2, 3}}},
		{name: "token id batch of one", outer: "m", body: `{"prompt":[[4,5]]}`, want: Query{Model: "m", Kind: InputTokens, TokenIDs: []uint32{4, 5}}},
		{name: "two prompts", outer: "m", body: `{"prompt":["a","b"]}`, code: InvalidArgument},
		{name: "two id prompts", outer: "m", body: `{"prompt":[[1],[2]]}`, code: InvalidArgument},
		{name: "negative id", outer: "m", body: `{"prompt":[-1]}`, code: InvalidArgument},
		{name: "both", outer: "m", body: `{"prompt":"a","messages":[]}`, code: InvalidArgument},
		{name: "neither", outer: "m", body: `{"model":"m"}`, code: InvalidArgument},
		{name: "embeds", outer: "m", body: `{"prompt_embeds":"AAAA"}`, code: InvalidArgument},
		{name: "not an object", outer: "m", body: `[1]`, code: InvalidArgument},
		{name: "request template", outer: "m", body: `{"messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"}`, code: FailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := Query{Model: c.outer}
			err := q.SetOpenAIRequest([]byte(c.body))
			if c.code != 0 {
				var ie *Error
				if !errors.As(err, &ie) || ie.Code != c.code {
					t.Fatalf("got %v, want %v", err, c.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if q.Model != c.want.Model || q.Kind != c.want.Kind || q.Prompt != c.want.Prompt || q.LoraName != c.want.LoraName ||
				q.CacheSalt != c.want.CacheSalt || !slices.Equal(q.TokenIDs, c.want.TokenIDs) ||
				(q.AddSpecialTokens == nil) != (c.want.AddSpecialTokens == nil) ||
				(q.AddSpecialTokens != nil && *q.AddSpecialTokens != *c.want.AddSpecialTokens) {
				t.Fatalf("got %+v\nwant %+v", q, c.want)
			}
			if c.chat != nil {
				g, _ := json.Marshal(q.Chat)
				w, _ := json.Marshal(c.chat)
				if string(g) != string(w) {
					t.Fatalf("chat\n got %s\nwant %s", g, w)
				}
			}
		})
	}
}
