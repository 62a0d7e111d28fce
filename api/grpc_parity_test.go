package api

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// jsonNames are the JSON field names of an HTTP answer struct.
func jsonNames(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// protoNames are the field names of a proto message.
func protoNames(m proto.Message) []string {
	var out []string
	fds := m.ProtoReflect().Descriptor().Fields()
	for i := 0; i < fds.Len(); i++ {
		out = append(out, string(fds.Get(i).Name()))
	}
	return out
}

// sameFieldSet fails unless the HTTP struct and the proto message have the
// same fields by name: a field added to one transport only fails here.
func sameFieldSet(t *testing.T, httpV any, m proto.Message) {
	t.Helper()
	inProto := map[string]bool{}
	for _, n := range protoNames(m) {
		inProto[n] = true
	}
	for _, n := range jsonNames(httpV) {
		if !inProto[n] {
			t.Errorf("HTTP %T has %q, gRPC %s lacks it", httpV, n, m.ProtoReflect().Descriptor().Name())
		}
		delete(inProto, n)
	}
	for n := range inProto {
		t.Errorf("gRPC %s has %q, HTTP %T lacks it", m.ProtoReflect().Descriptor().Name(), n, httpV)
	}
}

// diffFields compares every field of a gRPC message with the same-named
// field of an HTTP JSON object (absent = the zero value, as omitempty
// drops it), decoding the JSON into the proto field's Go type so numbers
// compare exactly. It returns the names that differ.
func diffFields(t *testing.T, httpObj map[string]json.RawMessage, m proto.Message) []string {
	t.Helper()
	var diff []string
	r := m.ProtoReflect()
	fds := r.Descriptor().Fields()
	for i := 0; i < fds.Len(); i++ {
		fd := fds.Get(i)
		got := r.Get(fd).Interface()
		want := reflect.New(reflect.TypeOf(got))
		if raw, ok := httpObj[string(fd.Name())]; ok {
			if err := json.Unmarshal(raw, want.Interface()); err != nil {
				t.Fatalf("HTTP %s = %s: %v", fd.Name(), raw, err)
			}
		}
		if want.Elem().Interface() != got {
			diff = append(diff, string(fd.Name())+": HTTP "+string(httpObj[string(fd.Name())])+", gRPC "+
				strings.TrimSpace(string(mustJSON(got))))
		}
	}
	return diff
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

func getJSON(t *testing.T, url, key string) []map[string]json.RawMessage {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string][]map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return body[key]
}

// storedEv is a BlockStored of the first n blocks of tokens with the keys
// the indexer computes (so parity holds).
func (st *stack) storedEv(tokens []uint32, n int) event.Event {
	keys := st.hashers.For(testModel).Keys(nil, tokens, blockkeys.RequestExtras{})
	ev := event.Event{Kind: event.BlockStored, BlockSize: testBlock, TokenIDs: tokens[:n*testBlock], Medium: event.TierGPU}
	for _, k := range keys[:n] {
		ev.BlockHashes = append(ev.BlockHashes, uint64(k))
	}
	return ev
}

func (st *stack) apply(pod string, rank int, evs ...event.Event) {
	st.idx.Sink().Apply(context.Background(), &event.Batch{Pod: pod, Model: testModel, DPRank: rank, Events: evs})
}

// ListPods answers every field GET /v1/pods has, with the same value, for
// pods whose fields are not at their defaults: an incomplete stream with a
// reason and an epoch, a hybrid model's skipped groups, kept copies, remote
// and unverified blocks, a stale pod restored from a snapshot, and a stream
// that delivered nothing yet.
func TestListPodsMatchesHTTP(t *testing.T) {
	sameFieldSet(t, PodInfo{}, &kvindexv1.PodInfo{})

	sub := &fakeSubscriber{streams: []kvevents.StreamStats{
		{Pod: "pod-a", DPRank: 0, Model: testModel, Endpoint: "tcp://10.0.0.7:5557", Engine: blockkeys.EngineSGLang,
			LastSeq: 21, Batches: 9, SeqGaps: 2, MissedBatches: 5, ReplayedBatches: 3, Restarts: 1, DecodeErrors: 4,
			Overflows: 6, CompleteSinceSeq: 17, IncompleteReason: "gap", Epoch: "ep-7"},
		{Pod: "pod-c", DPRank: 1, Model: testModel, Endpoint: "tcp://10.0.0.9:5557", Engine: blockkeys.EngineVLLM,
			LastSeq: 4, Batches: 5, Complete: true},
	}}
	// The indexer's own subscriber (never run) is the one owner of pod-b's
	// trust below; the listing's streams come from the fake.
	st := newStackWith(t, indexer.Config{Keys: testKeys, Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0"}},
		func(c *Config) { c.Subscriber = sub })
	toks := seqTokens(1, 12)

	// pod-a: a hybrid model, full attention plus a sliding window.
	full := st.storedEv(toks, 3)
	full.GroupKind = event.GroupFullAttention
	swa := st.storedEv(toks, 3)
	swa.GroupIdx, swa.GroupKind, swa.SlidingWindow = 1, event.GroupSlidingWindow, 4
	st.apply("pod-a", 0, full, swa)

	// pod-b: a block stored twice and removed once (a copy is kept),
	// remote blocks, a block without token ids (unverified); then it is
	// marked restored from a snapshot, so stale until its stream resumes.
	two := st.storedEv(toks, 2)
	st.apply("pod-b", 0, two, st.storedEv(toks, 1))
	st.apply("pod-b", 0, event.Event{Kind: event.BlockRemoved, BlockHashes: two.BlockHashes[:1]})
	remote := st.storedEv(seqTokens(100, 8), 2)
	remote.Remote = true
	unverified := st.storedEv(seqTokens(200, 4), 1)
	unverified.TokenIDs = nil
	st.apply("pod-b", 0, remote, unverified)
	st.idx.Subscriber().ResumeFrom("pod-b", 0, 9, true)

	httpPods := getJSON(t, st.http.URL+"/v1/pods", "pods")
	resp, err := st.grpc.ListPods(context.Background(), &kvindexv1.ListPodsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(httpPods) != 3 || len(resp.Pods) != len(httpPods) {
		t.Fatalf("HTTP %d pods, gRPC %d, want 3", len(httpPods), len(resp.Pods))
	}
	for i, p := range resp.Pods {
		if d := diffFields(t, httpPods[i], p); len(d) > 0 {
			t.Errorf("pod %s/%d differs:\n%s", p.Pod, p.DpRank, strings.Join(d, "\n"))
		}
	}

	// The fixture gives every field added for parity a non-default value
	// (else the comparison above would hold trivially).
	by := map[string]*kvindexv1.PodInfo{}
	for _, p := range resp.Pods {
		by[p.Pod] = p
	}
	a, b, c := by["pod-a"], by["pod-b"], by["pod-c"]
	if a == nil || b == nil || c == nil {
		t.Fatalf("pods %v", resp.Pods)
	}
	for name, ok := range map[string]bool{
		"replayed_batches":      a.ReplayedBatches == 3,
		"complete":              !a.Complete && c.Complete,
		"complete_since_seq":    a.CompleteSinceSeq == 17,
		"incomplete_reason":     a.IncompleteReason == "gap",
		"epoch":                 a.Epoch == "ep-7",
		"group_skipped_blocks":  a.GroupSkippedBlocks == 3,
		"full_attention_groups": a.FullAttentionGroups == 1,
		"copies_kept":           b.CopiesKept == 1,
		"remote_blocks":         b.RemoteBlocks == 2,
		"unverified_reason":     b.UnverifiedReason != "" && b.ParityUnverified > 0,
		"stale":                 b.Stale && !a.Stale,
		"last_event":            a.LastEvent != "" && c.LastEvent == "",
	} {
		if !ok {
			t.Errorf("%s: fixture value missing: pod-a %v\npod-b %v\npod-c %v", name, a, b, c)
		}
	}
}

// Endpoints: snapshot_address is accepted and listed by both transports
// (added over one, listed over the other), and every address the HTTP
// admin API refuses as a snapshot address gRPC refuses with the same
// reason: the endpoint address policy applies to it as to address and
// replay_address.
func TestEndpointSnapshotAddressBothTransports(t *testing.T) {
	sameFieldSet(t, EndpointInfo{}, &kvindexv1.Endpoint{})

	sub := &fakeSubscriber{}
	cidrs, err := ParseCIDRs([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	st := newStackWith(t, indexer.Config{Keys: testKeys}, func(c *Config) {
		c.Subscriber, c.AdminAPI, c.Endpoints = sub, true, &EndpointPolicy{AllowedCIDRs: cidrs}
	})
	ctx := context.Background()
	_, err = st.grpc.AddEndpoint(ctx, &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{
		Address: "tcp://10.0.0.7:5557", Pod: "p7", Engine: "sglang",
		ReplayAddress: "tcp://10.0.0.7:5558", SnapshotAddress: "tcp://10.0.0.7:5559"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sub.eps) != 1 || sub.eps[0].SnapshotAddress != "tcp://10.0.0.7:5559" || sub.eps[0].ReplayAddress != "tcp://10.0.0.7:5558" {
		t.Fatalf("subscriber got %+v", sub.eps)
	}
	code, body := st.post("/v1/endpoints", `{"address":"tcp://10.0.0.8:5557","pod":"p8","engine":"sglang","snapshot_address":"ipc:///run/sgl/snap.sock"}`)
	if code != http.StatusCreated || !strings.Contains(string(body), `"snapshot_address": "ipc:///run/sgl/snap.sock"`) {
		t.Fatalf("POST: %d %s", code, body)
	}

	httpEps := getJSON(t, st.http.URL+"/v1/endpoints", "endpoints")
	resp, err := st.grpc.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(httpEps) != 2 || len(resp.Endpoints) != 2 {
		t.Fatalf("HTTP %d endpoints, gRPC %v", len(httpEps), resp.Endpoints)
	}
	for i, ep := range resp.Endpoints {
		if d := diffFields(t, httpEps[i], ep); len(d) > 0 {
			t.Errorf("endpoint %s differs:\n%s", ep.Address, strings.Join(d, "\n"))
		}
	}
	if resp.Endpoints[0].SnapshotAddress != "tcp://10.0.0.7:5559" || resp.Endpoints[1].SnapshotAddress != "ipc:///run/sgl/snap.sock" {
		t.Fatalf("gRPC snapshot addresses: %v", resp.Endpoints)
	}

	for i, c := range []struct{ snapshot, reason string }{
		{"tcp://192.168.1.7:5559", "outside --allowed-endpoint-cidrs"},
		{"udp://10.0.0.7:5559", `scheme "udp" is not allowed`},
		{"tcp://*:5559", "a host is required"},
		{"tcp://u:pw@10.0.0.7:5559", "credentials"},
		{"tcp://10.0.0.7", "want tcp://host:port"},
		{"10.0.0.7:5559", "want tcp://host:port or ipc://path"},
	} {
		addr := "tcp://10.0.1." + itoa(i+1) + ":5557"
		code, body := st.post("/v1/endpoints", `{"address":"`+addr+`","engine":"sglang","snapshot_address":"`+c.snapshot+`"}`)
		var httpErr struct{ Error string }
		_ = json.Unmarshal(body, &httpErr)
		if code != http.StatusBadRequest || !strings.Contains(httpErr.Error, "snapshot address") || !strings.Contains(httpErr.Error, c.reason) {
			t.Errorf("HTTP snapshot %q: %d %s, want 400 naming the snapshot address and %q", c.snapshot, code, body, c.reason)
		}
		_, err := st.grpc.AddEndpoint(ctx, &kvindexv1.AddEndpointRequest{Endpoint: &kvindexv1.Endpoint{
			Address: addr, Engine: "sglang", SnapshotAddress: c.snapshot}})
		if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || s.Message() != httpErr.Error {
			t.Errorf("gRPC snapshot %q: %v, want InvalidArgument %q", c.snapshot, err, httpErr.Error)
		}
	}
	if len(sub.eps) != 2 {
		t.Fatalf("a refused endpoint reached the subscriber: %+v", sub.eps)
	}
}

// bosPrompt tokenizes a prompt as its bytes, with a leading BOS token (1)
// unless add_special_tokens is false (TokenizeRendered), as a Llama-style
// tokenizer does.
type bosPrompt struct{ echoPrompt }

func (b bosPrompt) TokenizePrompt(_ context.Context, _, p string) ([]uint32, error) {
	return append([]uint32{1}, b.ids(p)...), nil
}

func (b bosPrompt) TokenizeRendered(_ context.Context, _, p string) ([]uint32, error) {
	return b.ids(p), nil
}

// add_special_tokens of a prompt: the gRPC field scores as the HTTP body's
// (Score and Pick), and is refused where HTTP refuses it, with the reason.
func TestAddSpecialTokensBothTransports(t *testing.T) {
	chat := &echoChat{}
	st := newStackWith(t, indexer.Config{Keys: testKeys, Tokenizer: bosPrompt{}, Chat: chat})
	const prompt = "the quick brown fox jumps"
	plain := bosPrompt{}.ids(prompt)
	st.store("pod-a", 0, event.TierGPU, plain, len(plain)/testBlock, blockkeys.RequestExtras{})
	ctx := context.Background()
	off, on := false, true

	wantOff := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","prompt":"` + prompt + `","add_special_tokens":false}`))
	wantOn := summaryHTTP(st.scoreHTTP(`{"model":"` + testModel + `","prompt":"` + prompt + `"}`))
	if !strings.Contains(wantOff, "pod-a:6/") || strings.Contains(wantOn, "pod-a") {
		t.Fatalf("fixture: without special tokens %s, with %s", wantOff, wantOn)
	}
	for name, c := range map[string]struct {
		v    *bool
		want string
	}{"false": {&off, wantOff}, "true": {&on, wantOn}, "unset": {nil, wantOn}} {
		resp, err := st.grpc.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel,
			Input: &kvindexv1.ScoreRequest_Prompt{Prompt: prompt}, AddSpecialTokens: c.v})
		if err != nil || summaryGRPC(resp) != c.want {
			t.Errorf("gRPC Score add_special_tokens %s: %v %v, want %s", name, resp, err, c.want)
		}
	}
	cand := []*kvindexv1.Candidate{{Pod: "pod-b"}, {Pod: "pod-a"}}
	pick, err := st.grpc.Pick(ctx, &kvindexv1.PickRequest{Model: testModel, Input: &kvindexv1.PickRequest_Prompt{Prompt: prompt},
		AddSpecialTokens: &off, Candidates: cand, Policy: "cost"})
	if err != nil || pick.Pod != "pod-a" || pick.Candidates[1].MatchedBlocks != 6 {
		t.Fatalf("gRPC Pick add_special_tokens=false: %v %v", pick, err)
	}
	code, body := st.post("/v1/pick", `{"model":"`+testModel+`","prompt":"`+prompt+`","add_special_tokens":false,"policy":"cost","candidates":[{"pod":"pod-b"},{"pod":"pod-a"}]}`)
	if code != http.StatusOK || !strings.Contains(string(body), `"pod":"pod-a","dp_rank":0,"matched_blocks":6`) {
		t.Fatalf("HTTP pick: %d %s", code, body)
	}

	// Beside chat_json, the field applies when chat_json does not set it.
	msgs := `[{"role":"user","content":"hi"}]`
	if _, err := st.grpc.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `}`}, AddSpecialTokens: &on}); err != nil {
		t.Fatal(err)
	}
	if chat.last == nil || string(chat.last.Messages) != msgs {
		t.Fatalf("chat not rendered: %+v", chat.last)
	}

	// Refused: token_ids (as over HTTP), an OpenAI body (it carries its
	// own, as HTTP refuses a field beside "request"), and chat_json setting
	// it as well.
	code, body = st.post("/v1/score", `{"model":"`+testModel+`","token_ids":[1,2,3,4],"add_special_tokens":false}`)
	if code != http.StatusBadRequest || !strings.Contains(string(body), "add_special_tokens applies to prompt or messages only") {
		t.Fatalf("HTTP token_ids with add_special_tokens: %d %s", code, body)
	}
	for name, c := range map[string]struct {
		req    *kvindexv1.ScoreRequest
		reason string
	}{
		"token_ids": {&kvindexv1.ScoreRequest{Model: testModel, AddSpecialTokens: &off,
			Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: []uint32{1, 2, 3, 4}}}},
			"add_special_tokens applies to prompt or messages only"},
		"openai": {&kvindexv1.ScoreRequest{Model: testModel, AddSpecialTokens: &off,
			Input: &kvindexv1.ScoreRequest_OpenaiRequestJson{OpenaiRequestJson: `{"prompt":"` + prompt + `"}`}},
			"give add_special_tokens inside it"},
		"chat_json twice": {&kvindexv1.ScoreRequest{Model: testModel, AddSpecialTokens: &on,
			Input: &kvindexv1.ScoreRequest_ChatJson{ChatJson: `{"messages":` + msgs + `,"add_special_tokens":false}`}},
			"both in chat_json and beside it"},
	} {
		_, err := st.grpc.Score(ctx, c.req)
		if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), c.reason) {
			t.Errorf("gRPC Score %s: %v, want InvalidArgument %q", name, err, c.reason)
		}
		_, err = st.grpc.Pick(ctx, toPick(c.req, cand))
		if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), c.reason) {
			t.Errorf("gRPC Pick %s: %v, want InvalidArgument %q", name, err, c.reason)
		}
	}
	code, body = st.post("/v1/score", `{"model":"`+testModel+`","request":{"prompt":"x"},"add_special_tokens":false}`)
	if code != http.StatusBadRequest || !strings.Contains(string(body), "whole OpenAI body") {
		t.Fatalf("HTTP request with add_special_tokens: %d %s", code, body)
	}
}

// toPick is a score request as a pick request among cand.
func toPick(r *kvindexv1.ScoreRequest, cand []*kvindexv1.Candidate) *kvindexv1.PickRequest {
	p := &kvindexv1.PickRequest{Model: r.Model, AddSpecialTokens: r.AddSpecialTokens, Candidates: cand}
	switch in := r.GetInput().(type) {
	case *kvindexv1.ScoreRequest_TokenIds:
		p.Input = &kvindexv1.PickRequest_TokenIds{TokenIds: in.TokenIds}
	case *kvindexv1.ScoreRequest_OpenaiRequestJson:
		p.Input = &kvindexv1.PickRequest_OpenaiRequestJson{OpenaiRequestJson: in.OpenaiRequestJson}
	case *kvindexv1.ScoreRequest_ChatJson:
		p.Input = &kvindexv1.PickRequest_ChatJson{ChatJson: in.ChatJson}
	}
	return p
}
