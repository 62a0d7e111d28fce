package api

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvindex/kvindex/indexer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// Score and Pick read their input oneof through one function: for every
// input field, the same value in either request sets the same query, and
// add_special_tokens follows the same rules.
func TestGRPCInputSameForScoreAndPick(t *testing.T) {
	yes := true
	cases := []struct {
		name       string
		score      any // kvindexv1.ScoreRequest's oneof wrapper
		pick       any // the same input as kvindexv1.PickRequest's
		addSpecial *bool
		want       string // the query's input, as describe prints it
		code       codes.Code
		failKind   indexer.InputKind
	}{
		{name: "none", want: "none"},
		{name: "token ids", score: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2}}},
			pick: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2}}}, want: "token_ids [1 2]"},
		{name: "packed token ids", score: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: []byte{1, 0, 0, 0, 0, 1, 2, 0}}},
			pick: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: []byte{1, 0, 0, 0, 0, 1, 2, 0}}}, want: "token_ids [1 131328]"},
		{name: "packed token ids, bad length", score: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: []byte{1, 0, 0}}},
			pick: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: []byte{1, 0, 0}}},
			code: codes.InvalidArgument, failKind: indexer.InputTokens},
		{name: "ids and packed", score: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1}, Packed: []byte{1, 0, 0, 0}}},
			pick: &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1}, Packed: []byte{1, 0, 0, 0}}},
			code: codes.InvalidArgument, failKind: indexer.InputTokens},
		{name: "block hashes", score: &kvindexv1.ScoreRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: []uint64{7}}},
			pick: &kvindexv1.PickRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: []uint64{7}}}, want: "block_hashes [7]"},
		{name: "prompt", score: &kvindexv1.ScoreRequest_Prompt{Prompt: "hi"}, pick: &kvindexv1.PickRequest_Prompt{Prompt: "hi"},
			addSpecial: &yes, want: `prompt "hi" special=true`},
		{name: "empty prompt is a prompt", score: &kvindexv1.ScoreRequest_Prompt{}, pick: &kvindexv1.PickRequest_Prompt{}, want: `prompt ""`},
		{name: "chat", score: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":[{"role":"user","content":"x"}],"add_special_tokens":true}`},
			pick: &kvindexv1.PickRequest_ChatJson{ChatJson: `{"messages":[{"role":"user","content":"x"}],"add_special_tokens":true}`},
			want: `messages [{"role":"user","content":"x"}] special=true`},
		{name: "bad chat", score: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `[`}, pick: &kvindexv1.PickRequest_ChatJson{ChatJson: `[`},
			code: codes.InvalidArgument, failKind: indexer.InputMessages},
		{name: "chat and add_special_tokens beside it",
			score:      &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":[],"add_special_tokens":true}`},
			pick:       &kvindexv1.PickRequest_ChatJson{ChatJson: `{"messages":[],"add_special_tokens":true}`},
			addSpecial: &yes, code: codes.InvalidArgument},
		{name: "openai completion", score: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{"model":"m","prompt":[3,4]}`},
			pick: &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: `{"model":"m","prompt":[3,4]}`}, want: "token_ids [3 4]"},
		{name: "openai chat", score: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{"messages":[{"role":"user","content":"y"}]}`},
			pick: &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: `{"messages":[{"role":"user","content":"y"}]}`},
			want: `messages [{"role":"user","content":"y"}]`},
		{name: "bad openai", score: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `1`},
			pick: &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: `1`}, code: codes.InvalidArgument},
		{name: "openai and add_special_tokens beside it", score: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{"prompt":"p"}`},
			pick: &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: `{"prompt":"p"}`}, addSpecial: &yes, code: codes.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, in := range []any{c.score, c.pick} {
				var q indexer.Query
				kind, e := setGRPCInput(&q, in, c.addSpecial)
				if c.code != codes.OK {
					if e == nil || e.Code != c.code || kind != c.failKind {
						t.Fatalf("%T: got kind %v, error %v; want kind %v, code %v", in, kind, e, c.failKind, c.code)
					}
					continue
				}
				if e != nil {
					t.Fatalf("%T: %v", in, e)
				}
				if got := describe(&q); got != c.want || kind != q.Kind {
					t.Fatalf("%T: query %s (kind %v), want %s", in, got, kind, c.want)
				}
			}
		})
	}
}

// describe prints the input a query carries.
func describe(q *indexer.Query) string {
	var s string
	switch q.Kind {
	case indexer.InputNone:
		s = "none"
	case indexer.InputTokens:
		s = fmt.Sprint("token_ids ", q.TokenIDs)
	case indexer.InputHashes:
		s = fmt.Sprint("block_hashes ", q.BlockHashes)
	case indexer.InputPrompt:
		s = fmt.Sprintf("prompt %q", q.Prompt)
	case indexer.InputMessages:
		s = "messages " + string(q.Chat.Messages)
	}
	if q.AddSpecialTokens != nil {
		s += fmt.Sprint(" special=", *q.AddSpecialTokens)
	}
	return s
}

// Every input field of both oneofs is handled: a field added to the proto
// without a case here and in setGRPCInput fails.
func TestGRPCInputCoversEveryField(t *testing.T) {
	want := []string{"block_hashes", "chat_json", "openai_request_json", "prompt", "token_ids"}
	for _, m := range []protoreflect.ProtoMessage{&kvindexv1.ScoreRequest{}, &kvindexv1.PickRequest{}} {
		od := m.ProtoReflect().Descriptor().Oneofs().ByName("input")
		var fields []string
		for i := 0; i < od.Fields().Len(); i++ {
			fields = append(fields, string(od.Fields().Get(i).Name()))
		}
		slices.Sort(fields)
		if !slices.Equal(fields, want) {
			t.Errorf("%s input oneof has %v; setGRPCInput and its test handle %v", m.ProtoReflect().Descriptor().FullName(), fields, want)
		}
	}
}
