package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/indexer"
)

// TestDynamoScoresAnswer: Dynamo's score shape from a walk, in tokens,
// pods and ranks in the order met, frequencies as walked, tree_sizes from
// the listing (an unreadable count is 0).
func TestDynamoScoresAnswer(t *testing.T) {
	res := &indexer.DynamoResult{Ranks: []indexer.DynamoRank{{Pod: "7", DPRank: 1, Blocks: 3}, {Pod: "8", DPRank: 0, Blocks: 2}, {Pod: "7", DPRank: 0, Blocks: 1}},
		Frequencies: []int{3, 2, 1}}
	sizes := map[indexer.PodRef]int64{{Name: "7", DPRank: 1}: 5, {Name: "7", DPRank: 0}: 1, {Name: "8", DPRank: 0}: -1}
	got := strings.TrimSpace(string(appendDynamoScores(nil, res, 16, sizes)))
	want := `{"scores":{"7":{"1":48,"0":16},"8":{"0":32}},"frequencies":[3,2,1],"tree_sizes":{"7":{"1":5,"0":1},"8":{"0":0}}}`
	if got != want || !json.Valid([]byte(got)) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	empty := strings.TrimSpace(string(appendDynamoScores(nil, &indexer.DynamoResult{}, 16, nil)))
	if empty != `{"scores":{},"frequencies":[],"tree_sizes":{}}` {
		t.Errorf("no match: %s", empty)
	}
}

// TestDynamoQueryForm: a body with model_name (and not model) is Dynamo's;
// a (model, tenant) this daemon has no worker, endpoint or stream of, or
// that it cannot hold (a tenant id or model name it refuses), is Dynamo's
// 404; a body naming both is Mooncake's error.
func TestDynamoQueryForm(t *testing.T) {
	st := newStack(t)
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"tenant_id":"t2"}`, http.StatusNotFound, "no indexer for model=m tenant=t2"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"routing_group":"g"}`, http.StatusNotFound, "no indexer for model=m tenant=g"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"routing_group":"g","tenant_id":"h"}`, http.StatusNotFound, "no indexer for model=m tenant=h"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"tenant_id":"a b"}`, http.StatusNotFound, "no indexer for model=m tenant=a b"},
		{"/query", `{"model_name":"a\\m","token_ids":[1,2,3,4],"tenant_id":"t"}`, http.StatusNotFound, "no indexer for model=a\\m tenant=t"},
		{"/query", `{"model":"m","token_ids":[1,2,3,4],"routing_group":"default"}`, http.StatusBadRequest, "send it with model_name"},
		{"/query", `{"model_name":"m","model":"m","token_ids":[1]}`, http.StatusBadRequest, "not both"},
		{"/query_by_hash", `{"model_name":"m","model":"m","block_hashes":[1]}`, http.StatusBadRequest, "not both"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4]}`, http.StatusNotFound, "no indexer for model=m tenant=default"},
		{"/query_by_hash", `{"model_name":"m","block_hashes":[-5]}`, http.StatusNotFound, "no indexer for model=m tenant=default"},
	} {
		code, b := st.post(tc.path, tc.body)
		var e struct{ Error string }
		if code != tc.status || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.path, tc.body, code, b, tc.status, tc.want)
		}
	}
}
