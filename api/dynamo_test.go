package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

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

// TestDynamoPeersCapped: the peer registry is seeded with --peers (once
// each), holds at most maxPeers URLs of at most maxPeerURL bytes, and
// counts them in kvindexd_dynamo_peers.
func TestDynamoPeersCapped(t *testing.T) {
	st := newStackWith(t, indexer.Config{Keys: testKeys}, func(c *Config) {
		c.AdminAPI = true
		c.Peers = []string{"http://a:1", "http://a:1", "http://b:2"}
	})
	resp, err := http.Get(st.http.URL + "/peers")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != `["http://a:1","http://b:2"]` {
		t.Fatalf("seeded: %d %s", resp.StatusCode, b)
	}
	for i := 2; i < maxPeers; i++ {
		if code, b := st.post("/register_peer", fmt.Sprintf(`{"url":"http://p:%d"}`, i)); code != http.StatusCreated {
			t.Fatalf("peer %d: %d %s", i, code, b)
		}
	}
	if code, b := st.post("/register_peer", `{"url":"http://one-more:1"}`); code != http.StatusConflict || !strings.Contains(string(b), "the limit") {
		t.Errorf("peer %d: %d %s, want 409", maxPeers+1, code, b)
	}
	if code, _ := st.post("/register_peer", `{"url":"http://a:1"}`); code != http.StatusCreated {
		t.Errorf("a listed peer again: %d, want 201", code)
	}
	long := `{"url":"http://` + strings.Repeat("x", maxPeerURL) + `"}`
	if code, b := st.post("/deregister_peer", `{"url":"http://b:2"}`); code != http.StatusOK {
		t.Fatalf("deregister: %d %s", code, b)
	}
	if code, b := st.post("/register_peer", long); code != http.StatusBadRequest || !strings.Contains(string(b), "more than") {
		t.Errorf("a long url: %d %s, want 400", code, b)
	}
	if got := testutil.ToFloat64(st.srv.dynPeers.gauge); got != maxPeers-1 {
		t.Errorf("kvindexd_dynamo_peers = %v, want %d", got, maxPeers-1)
	}
}
