package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// TestMooncakeQuery checks both Mooncake query endpoints against the same
// fleet as TestScoreBothTransports: the answers are /v1/score's, in tokens.
func TestMooncakeQuery(t *testing.T) {
	st := newStack(t)
	prompt := seqTokens(1000, 10*testBlock+2)
	st.store("pod-a", 0, event.TierGPU, prompt, 6, blockkeys.RequestExtras{})
	st.store("pod-b", 0, event.TierCPU, prompt, 8, blockkeys.RequestExtras{})
	st.store("pod-c", 0, event.TierGPU, prompt, 2, blockkeys.RequestExtras{})
	st.store("pod-c", 1, event.TierGPU, prompt, 7, blockkeys.RequestExtras{})
	lora := blockkeys.RequestExtras{LoraName: "sql-adapter"}
	st.store("pod-l", 0, event.TierDisk, prompt, 3, lora)

	ids, _ := json.Marshal(prompt)
	keys := st.hashers.For(testModel).Keys(nil, prompt, blockkeys.RequestExtras{})
	hashes, _ := json.Marshal(keys)
	loraKeys, _ := json.Marshal(st.hashers.For(testModel).Keys(nil, prompt, lora))

	// Tokens: blocks x 4. pod-c's best rank (1) gives longest_matched.
	// Pods in score order, as /v1/score lists them.
	wantAll := `{"default":{` +
		`"pod-c":{"longest_matched":28,"GPU":28,"CPU":0,"DISK":0,"EXTERNAL":0,"DP":{"1":28,"0":8}},` +
		`"pod-b":{"longest_matched":32,"GPU":0,"CPU":32,"DISK":0,"EXTERNAL":0,"DP":{"0":32}},` +
		`"pod-a":{"longest_matched":24,"GPU":24,"CPU":0,"DISK":0,"EXTERNAL":0,"DP":{"0":24}}}}`
	for _, tc := range []struct{ name, path, body, want string }{
		{"tokens", "/query", `{"model":"` + testModel + `","token_ids":` + string(ids) + `}`, wantAll},
		{"hashes", "/query_by_hash", `{"model":"` + testModel + `","seq_hashes":` + string(hashes) + `,"block_size":4}`, wantAll},
		{"older hash field", "/query_by_hash", `{"model":"` + testModel + `","block_hash":` + string(hashes) + `}`, wantAll},
		{"instance", "/query", `{"model":"` + testModel + `","token_ids":` + string(ids) +
			`,"instance_id":"pod-c","tenant_id":"default","block_size":4}`,
			`{"default":{"pod-c":{"longest_matched":28,"GPU":28,"CPU":0,"DISK":0,"EXTERNAL":0,"DP":{"1":28,"0":8}}}}`},
		// tenant_id selects the tenant's namespace: these blocks are the
		// default tenant's, so team-a's answer counts none of them.
		{"another tenant", "/query", `{"model":"` + testModel + `","token_ids":` + string(ids) +
			`,"instance_id":"pod-c","tenant_id":"team-a","block_size":4}`, `{"team-a":{}}`},
		{"lora by tokens", "/query", `{"model":"` + testModel + `","lora_name":"sql-adapter","token_ids":` + string(ids) + `}`,
			`{"default":{"pod-l":{"longest_matched":12,"GPU":0,"CPU":0,"DISK":12,"EXTERNAL":0,"DP":{"0":12}}}}`},
		// RFC clients send lora_name along with hashes that already include it.
		{"lora by hashes", "/query_by_hash", `{"model":"` + testModel + `","lora_name":"sql-adapter","seq_hashes":` + string(loraKeys) + `}`,
			`{"default":{"pod-l":{"longest_matched":12,"GPU":0,"CPU":0,"DISK":12,"EXTERNAL":0,"DP":{"0":12}}}}`},
		{"nothing cached", "/query", `{"model":"` + testModel + `","token_ids":[1,2,3,4,5,6,7,8]}`, `{"default":{}}`},
	} {
		code, b := st.post(tc.path, tc.body)
		if code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, code, b)
		}
		if got := strings.TrimSpace(string(b)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
		if !json.Valid(b) {
			t.Errorf("%s: invalid JSON %s", tc.name, b)
		}
	}
}

func TestMooncakeQueryErrors(t *testing.T) {
	st := newStack(t)
	for _, tc := range []struct{ path, body, want string }{
		{"/query", `{"token_ids":[1,2,3,4]}`, "model is required"},
		{"/query", `{"model":"m","token_ids":[]}`, "token_ids is empty"},
		{"/query", `{"model":"m","token_ids":[4294967296]}`, "invalid JSON body"},
		{"/query", `{"model":"m","token_ids":[1],"medium":["L1"]}`, `unknown field "medium"`},
		{"/query", `{"model":"m","token_ids":[1],"lora_id":3}`, "lora_id is not supported"},
		{"/query", `{"model":"m","seq_hashes":[1]}`, "send hashes to /query_by_hash"},
		{"/query", `{"model":"m","token_ids":[1,2,3,4],"block_size":16}`, "blocks of 4 tokens"},
		{"/query_by_hash", `{"model":"m","token_ids":[1]}`, "send token ids to /query"},
		{"/query_by_hash", `{"model":"m","seq_hashes":[1],"block_hash":[1]}`, "not both"},
		{"/query_by_hash", `{"model":"m","seq_hashes":[1.5]}`, "seq_hashes[0]"},
		{"/query_by_hash", `{"model":"m","seq_hashes":[]}`, "block_hashes is empty"},
		{"/query_by_hash", `not json`, "invalid JSON body"},
	} {
		code, b := st.post(tc.path, tc.body)
		var e struct{ Error, Code string }
		if code != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, tc.want) || e.Code != "InvalidArgument" {
			t.Errorf("%s %s: %d %s, want 400 with %q", tc.path, tc.body, code, b, tc.want)
		}
	}
}

// TestUnroutedRequestsAnswerJSON: a wrong method or an unknown path gets
// the same JSON error body as every other failure.
func TestUnroutedRequestsAnswerJSON(t *testing.T) {
	st := newStack(t)
	for _, tc := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/v1/score", http.StatusMethodNotAllowed, "Unimplemented", "POST"},
		{"PUT", "/v1/pick", http.StatusMethodNotAllowed, "Unimplemented", "POST"},
		// /v1/endpoints is the admin API: off by default, so 403 before routing.
		{"PUT", "/v1/endpoints", http.StatusForbidden, "PermissionDenied", ""},
		{"GET", "/query", http.StatusMethodNotAllowed, "Unimplemented", "POST"},
		{"GET", "/v2/nothing", http.StatusNotFound, "NotFound", ""},
	} {
		req, _ := http.NewRequest(tc.method, st.http.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error, Code string }
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || err != nil || e.Code != tc.code || e.Error == "" ||
			resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %q %+v (%v), want %d JSON with code %s", tc.method, tc.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), e, err, tc.status, tc.code)
		}
		if tc.allow != "" && !strings.Contains(e.Error, tc.allow) {
			t.Errorf("%s %s: %q does not list the allowed methods %s", tc.method, tc.path, e.Error, tc.allow)
		}
	}
}
