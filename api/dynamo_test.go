package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/indexer"
)

// TestDynamoScoresAnswer: Dynamo's score shape from a result, in tokens;
// ranks and pods matching nothing are left out, frequencies count the
// (instance, rank) pairs at each depth, tree_sizes come from the listing.
func TestDynamoScoresAnswer(t *testing.T) {
	res := &indexer.Result{BlockSize: 16, Pods: []indexer.PodResult{
		{Pod: "7", MatchedBlocks: 3, Ranks: []indexer.RankScore{{DPRank: 1, MatchedBlocks: 3}, {DPRank: 0, MatchedBlocks: 1}, {DPRank: 2}}},
		{Pod: "8", MatchedBlocks: 2, Ranks: []indexer.RankScore{{DPRank: 0, MatchedBlocks: 2}}},
		{Pod: "9", Ranks: []indexer.RankScore{{DPRank: 0}}},
	}}
	sizes := map[indexer.PodRef]int64{{Name: "7", DPRank: 1}: 5, {Name: "7", DPRank: 0}: 1, {Name: "8", DPRank: 0}: -1}
	got := strings.TrimSpace(string(appendDynamoScores(nil, res, sizes)))
	want := `{"scores":{"7":{"1":48,"0":16},"8":{"0":32}},"frequencies":[3,2,1],"tree_sizes":{"7":{"1":5,"0":1},"8":{"0":0}}}`
	if got != want || !json.Valid([]byte(got)) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	empty := strings.TrimSpace(string(appendDynamoScores(nil, &indexer.Result{BlockSize: 16}, nil)))
	if empty != `{"scores":{},"frequencies":[],"tree_sizes":{}}` {
		t.Errorf("no match: %s", empty)
	}
}

// TestDynamoQueryForm: a body with model_name is Dynamo's; it cannot also
// name model, and a (model, tenant) this daemon has no worker, endpoint or
// stream of is Dynamo's 404.
func TestDynamoQueryForm(t *testing.T) {
	st := newStack(t)
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"tenant_id":"t2"}`, http.StatusNotFound, "no indexer for model=m tenant=t2"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"routing_group":"g"}`, http.StatusNotFound, "no indexer for model=m tenant=g"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"routing_group":"g","tenant_id":"h"}`, http.StatusBadRequest, "differ"},
		{"/query", `{"model_name":"m","token_ids":[1,2,3,4],"tenant_id":"a b"}`, http.StatusBadRequest, "not allowed in a tenant id"},
		{"/query", `{"model_name":"a\\m","token_ids":[1,2,3,4],"tenant_id":"t"}`, http.StatusBadRequest, "backslash is reserved"},
		{"/query", `{"model":"m","token_ids":[1,2,3,4],"routing_group":"default"}`, http.StatusBadRequest, "send it with model_name"},
		{"/query", `{"model_name":"m","model":"m","token_ids":[1]}`, http.StatusBadRequest, "not both"},
		{"/query_by_hash", `{"model_name":"m","block_hashes":[1],"seq_hashes":[1]}`, http.StatusBadRequest, "not both"},
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
