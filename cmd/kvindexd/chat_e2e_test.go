package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

const chatModel = "Qwen/Qwen3-0.6B"

// chatCase is one parity conversation with its references: the Jinja2
// render's outcome (gen_golden.py) and HF tokenizers' ids of the render
// (gen-render-ids.mjs). Neither comes from our code.
type chatCase struct {
	name string
	// body is the conversation as request fields (messages, tools, ...).
	body map[string]json.RawMessage
	ids  []uint32 // nil when Jinja2 raised
	err  string
}

func loadChatCases(t *testing.T) []chatCase {
	t.Helper()
	golden := map[string]string{} // case -> Jinja2 error, "" = rendered
	readLines(t, "../../tokenization/chattemplate/testdata/parity/golden/qwen3.jsonl", func(b []byte) {
		var g struct {
			Case  string `json:"case"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		golden[g.Case] = g.Error
	})
	ids := map[string][]uint32{}
	readLines(t, "../../tokenization/chattemplate/testdata/parity/qwen3_ids.jsonl", func(b []byte) {
		var g struct {
			Case string   `json:"case"`
			IDs  []uint32 `json:"ids"`
		}
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		ids[g.Case] = g.IDs
	})
	var out []chatCase
	readLines(t, "../../tokenization/chattemplate/testdata/parity/conversations.jsonl", func(b []byte) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var name string
		_ = json.Unmarshal(m["name"], &name)
		delete(m, "name")
		gerr, ok := golden[name]
		if !ok {
			t.Fatalf("no golden for %s", name)
		}
		c := chatCase{name: name, body: m, ids: ids[name], err: gerr}
		if gerr == "" && c.ids == nil {
			t.Fatalf("no reference ids for %s", name)
		}
		out = append(out, c)
	})
	if len(out) < 40 {
		t.Fatalf("only %d conversations", len(out))
	}
	return out
}

// withFields is body plus extra top-level fields, as JSON.
func withFields(body map[string]json.RawMessage, extra map[string]any) string {
	m := make(map[string]json.RawMessage, len(body)+len(extra))
	for k, v := range body {
		m[k] = v
	}
	for k, v := range extra {
		b, _ := json.Marshal(v)
		m[k] = b
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// publish applies one BlockStored of ids' full blocks, hashed as an engine
// with the daemon's key config does, from pod for model.
func (e *e2eDaemon) publish(pod, model string, ids []uint32) {
	e.t.Helper()
	kc := e.d.idx.KeyConfig(model)
	h, err := blockkeys.NewHasher(kc)
	if err != nil {
		e.t.Fatal(err)
	}
	keys := h.Keys(nil, ids, blockkeys.RequestExtras{})
	if len(keys) == 0 {
		return
	}
	ev := event.Event{Kind: event.BlockStored, BlockSize: kc.BlockSize, TokenIDs: ids[:len(keys)*kc.BlockSize]}
	for _, k := range keys {
		ev.BlockHashes = append(ev.BlockHashes, uint64(k))
	}
	e.d.idx.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: model, Events: []event.Event{ev}})
}

// postScore returns the status and, on 200, "total=N pod:blocks ..." or the
// error body.
func (e *e2eDaemon) postScore(body string) (int, string) {
	e.t.Helper()
	resp, err := http.Post(e.base+"/v1/score", "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(b)
	}
	var out struct {
		TotalBlocks int `json:"total_blocks"`
		Pods        []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matched_blocks"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		e.t.Fatal(err)
	}
	s := fmt.Sprintf("total=%d", out.TotalBlocks)
	for _, p := range out.Pods {
		s += fmt.Sprintf(" %s:%d", p.Pod, p.MatchedBlocks)
	}
	return resp.StatusCode, s
}

func (e *e2eDaemon) grpcScore(req *kvindexv1.ScoreRequest) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.grpc.Score(ctx, req)
	if err != nil {
		return "", err
	}
	s := fmt.Sprintf("total=%d", resp.TotalBlocks)
	for _, p := range resp.Pods {
		s += fmt.Sprintf(" %s:%d", p.Pod, p.MatchedBlocks)
	}
	return s, nil
}

// TestChatScoreEqualsEngineTokenIDs: scoring a chat, in every accepted
// shape and over both transports, equals scoring the token ids vLLM
// computes for it. The references are Jinja2's render of the Qwen3 template
// tokenized by HF tokenizers. With block size 1 every token is a block and
// the engine pod holds exactly the reference ids, so "all blocks matched and
// as many blocks as reference tokens" means the ids are equal token for
// token. Conversations Jinja2 refuses answer 400 / InvalidArgument with the
// template's reason.
func TestChatScoreEqualsEngineTokenIDs(t *testing.T) {
	cases := loadChatCases(t)
	e := startInProcess(t, func(c *Config) {
		c.BlockSize = 1
		c.Tokenizers = map[string]string{chatModel: qwen3Dir}
	})
	for _, c := range cases {
		if c.ids != nil {
			e.publish("engine", chatModel, c.ids)
		}
	}
	checked := 0
	for _, c := range cases {
		chatJSON := withFields(c.body, nil)
		shapes := map[string]string{
			"messages": withFields(c.body, map[string]any{"model": chatModel}),
			"router chat body": fmt.Sprintf(`{"model":%q,"request":%s}`, chatModel,
				withFields(c.body, map[string]any{"model": chatModel, "temperature": 0.7, "max_tokens": 64, "stream": true})),
		}
		grpcShapes := map[string]*kvindexv1.ScoreRequest{
			"chat_json": {Model: chatModel, Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: chatJSON}},
			"openai_request_json": {Model: chatModel, Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{
				OpenaiRequestJson: withFields(c.body, map[string]any{"model": chatModel, "n": 1})}},
		}
		if c.ids == nil {
			reason := c.err[strings.Index(c.err, ": ")+2:]
			for name, body := range shapes {
				if code, got := e.postScore(body); code != http.StatusBadRequest || !strings.Contains(got, reason) {
					t.Errorf("%s via %s: %d %s, want 400 with %q", c.name, name, code, got, reason)
				}
			}
			for name, req := range grpcShapes {
				if _, err := e.grpcScore(req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), reason) {
					t.Errorf("%s via gRPC %s: %v, want InvalidArgument with %q", c.name, name, err, reason)
				}
			}
			continue
		}
		idsJSON, _ := json.Marshal(c.ids)
		want := fmt.Sprintf("total=%d engine:%d", len(c.ids), len(c.ids))
		if code, got := e.postScore(fmt.Sprintf(`{"model":%q,"token_ids":%s}`, chatModel, idsJSON)); code != 200 || got != want {
			t.Fatalf("%s: token ids score %d %s, want %s", c.name, code, got, want)
		}
		for name, body := range shapes {
			if code, got := e.postScore(body); code != http.StatusOK || got != want {
				t.Errorf("%s via HTTP %s: %d %s, want %s", c.name, name, code, got, want)
			}
		}
		grpcShapes["token_ids"] = &kvindexv1.ScoreRequest{Model: chatModel,
			Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: c.ids}}}
		for name, req := range grpcShapes {
			if got, err := e.grpcScore(req); err != nil || got != want {
				t.Errorf("%s via gRPC %s: %s %v, want %s", c.name, name, got, err, want)
			}
		}
		checked++
	}
	if checked < 40 {
		t.Fatalf("only %d conversations compared", checked)
	}
	// A model whose tokenizer has no chat template is this daemon's limit
	// (422), not the request's fault.
	// A tiny real tokenizer.json (BPE over "a", "b") and no tokenizer_config.json.
	bare := t.TempDir()
	tiny := `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,` +
		`"model":{"type":"BPE","unk_token":null,"vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`
	if err := os.WriteFile(filepath.Join(bare, "tokenizer.json"), []byte(tiny), 0o644); err != nil {
		t.Fatal(err)
	}
	e2 := startInProcess(t, func(c *Config) { c.Tokenizers = map[string]string{"bare": bare} })
	if code, got := e2.postScore(`{"model":"bare","messages":[{"role":"user","content":"hi"}]}`); code != http.StatusUnprocessableEntity || !strings.Contains(got, "chat template") {
		t.Errorf("model without template: %d %s", code, got)
	}
}
