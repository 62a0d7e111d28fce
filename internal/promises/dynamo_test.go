package promises

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// NVIDIA Dynamo's standalone-indexer API, driven as Dynamo's own Python test
// harness drives dynamo-kv-indexer, on the shipped binary with real libzmq
// publishers (hack/kvpublisher.py, Debian's python3-zmq). The requests and
// the assertions are those of ai-dynamo/dynamo's tests/router:
//
//   - test_router_e2e_with_mockers.py, MockerProcess.launch_mockers_with_indexer:
//     POST /register {instance_id, endpoint, dp_rank, model_name, block_size}
//     per (worker, dp_rank), expecting 201;
//   - common.py (helper) wait_for_indexer_workers_active: GET /workers until
//     every worker with source "zmq" lists each dp_rank under listeners with
//     its endpoint and status "active";
//   - common.py _test_router_decisions: blocks A..G of block_size tokens;
//     worker a holds [A,B], [A,C,D], then F under [A,C,D]; worker b holds
//     [A,C,E], then G under [A,C]; POST /query {token_ids: A+C+D+F,
//     model_name} answers 200 and scores[str(a)][str(dp_a)] >
//     scores[str(b)][str(dp_b)]; the dumped events number 5 for a and 4 for
//     b (here: tree_sizes, the blocks each holds). With test_dp_rank, a and
//     b are ranks 0 and 1 of one worker.
//
// Read at the versions holding tenant_id (server.rs at
// ai-dynamo/dynamo@bc2583516003); the statuses and error bodies checked
// beyond the harness are that server's.

// dynBlocks are the harness's seven blocks A..G.
func dynBlocks() [7][]uint32 {
	var b [7][]uint32
	for i := range b {
		b[i] = prompt(900+i, 1)
	}
	return b
}

func cat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

// dynStore publishes the blocks of tokens past the first skip blocks as one
// BlockStored, parented on the block before them, with no
// data_parallel_rank (the registered dp_rank applies).
func dynStore(t *testing.T, p *pypub.Publisher, seq *uint64, tokens []uint32, skip int) {
	t.Helper()
	hs := engineHashes(t, tokens)
	ev := pypub.Event{Type: "BlockStored", BlockHashes: hs[skip:], TokenIDs: tokens[skip*blockSize:], BlockSize: blockSize}
	if skip > 0 {
		ev.ParentHash = &hs[skip-1]
	}
	p.Send(pypub.Batch{Topic: "", Seq: *seq, Form: "array", Events: []pypub.Event{ev}})
	*seq++
}

type dynScores struct {
	Scores      map[string]map[string]int `json:"scores"`
	Frequencies []int                     `json:"frequencies"`
	TreeSizes   map[string]map[string]int `json:"tree_sizes"`
}

func dynPost(t *testing.T, d *harness.Daemon, path string, body any) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	code, resp, _ := d.Do("POST", path, string(b))
	return code, resp
}

// workersActive is wait_for_indexer_workers_active's check.
func workersActive(d *harness.Daemon, want map[uint64]map[int]string) string {
	code, body := d.Get("/workers")
	if code != http.StatusOK {
		return fmt.Sprintf("GET /workers: %d %s", code, body)
	}
	var workers []struct {
		InstanceID uint64 `json:"instance_id"`
		Source     string `json:"source"`
		Listeners  map[string]struct {
			Endpoint, Status string
		} `json:"listeners"`
	}
	if err := json.Unmarshal([]byte(body), &workers); err != nil {
		return err.Error()
	}
	for id, eps := range want {
		i := slices.IndexFunc(workers, func(w struct {
			InstanceID uint64 `json:"instance_id"`
			Source     string `json:"source"`
			Listeners  map[string]struct {
				Endpoint, Status string
			} `json:"listeners"`
		}) bool {
			return w.InstanceID == id && w.Source == "zmq"
		})
		if i < 0 {
			return fmt.Sprintf("worker %d not listed: %s", id, body)
		}
		for rank, ep := range eps {
			l, ok := workers[i].Listeners[strconv.Itoa(rank)]
			if !ok || l.Endpoint != ep || l.Status != "active" {
				return fmt.Sprintf("worker %d rank %d: %+v", id, rank, l)
			}
		}
	}
	return ""
}

// TestPromiseDynamoIndexerConformance: _test_router_decisions against
// kvindexd, in both of the harness's layouts (two workers; two DP ranks of
// one worker), then unregister by rank and by instance.
func TestPromiseDynamoIndexerConformance(t *testing.T) {
	t.Parallel()
	pypub.RequirePython(t)
	d := harness.Start(t, "--admin-api")
	A, B, C, D, E, F, G := func() ([]uint32, []uint32, []uint32, []uint32, []uint32, []uint32, []uint32) {
		b := dynBlocks()
		return b[0], b[1], b[2], b[3], b[4], b[5], b[6]
	}()

	for _, tc := range []struct {
		name       string
		dpRank     bool
		ida, idb   uint64 // Dynamo worker ids are u64, often above 2^53
		ranka, rkb int
	}{
		{name: "two workers", ida: 7587888160383924001, idb: 7587888160383924002},
		{name: "dp ranks", dpRank: true, ida: 7587888160383924003, idb: 7587888160383924003, ranka: 0, rkb: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			modelName := "dynamo/" + strings.ReplaceAll(tc.name, " ", "-")
			addrA := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			addrB := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
			pa, pb := pypub.StartPublisher(t, addrA, true), pypub.StartPublisher(t, addrB, true)
			for _, r := range []struct {
				id   uint64
				rank int
				addr string
			}{{tc.ida, tc.ranka, addrA}, {tc.idb, tc.rkb, addrB}} {
				// launch_mockers_with_indexer's payload, verbatim.
				code, body := dynPost(t, d, "/register", map[string]any{"instance_id": r.id, "endpoint": r.addr,
					"dp_rank": r.rank, "model_name": modelName, "block_size": blockSize})
				if code != http.StatusCreated || strings.TrimSpace(body) != `{"status":"ok"}` {
					t.Fatalf("register %d rank %d: %d %s, want 201 {\"status\":\"ok\"}", r.id, r.rank, code, body)
				}
			}
			want := map[uint64]map[int]string{tc.ida: {tc.ranka: addrA}}
			want[tc.idb] = map[int]string{tc.rkb: addrB}
			if tc.dpRank {
				want = map[uint64]map[int]string{tc.ida: {0: addrA, 1: addrB}}
			}
			wait.Until(t, "the indexer's listeners are active", func() string { return workersActive(d, want) })
			pa.WaitReady(harness.ReadyLimit)
			pb.WaitReady(harness.ReadyLimit)

			var sa, sb uint64
			dynStore(t, pa, &sa, cat(A, B), 0)
			dynStore(t, pa, &sa, cat(A, C, D), 1)
			dynStore(t, pb, &sb, cat(A, C, E), 0)
			dynStore(t, pa, &sa, cat(A, C, D, F), 3) // req4, routed to a
			dynStore(t, pb, &sb, cat(A, C, G), 2)    // req5, routed to b

			ia, ib := strconv.FormatUint(tc.ida, 10), strconv.FormatUint(tc.idb, 10)
			ra, rb := strconv.Itoa(tc.ranka), strconv.Itoa(tc.rkb)
			req4 := cat(A, C, D, F)
			var got dynScores
			wait.Until(t, "the /query answer of _test_router_decisions", func() string {
				code, body := dynPost(t, d, "/query", map[string]any{"token_ids": req4, "model_name": modelName})
				if code != http.StatusOK {
					return fmt.Sprintf("POST /query: %d %s", code, body)
				}
				got = dynScores{}
				if err := json.Unmarshal([]byte(body), &got); err != nil {
					return err.Error()
				}
				// The harness asserts a > b; the exact values are one step
				// further: a holds A,C,D,F (4 blocks), b A,C (2), and the
				// trees hold the 5 and 4 blocks the harness counts as events.
				if got.Scores[ia][ra] != 4*blockSize || got.Scores[ib][rb] != 2*blockSize ||
					!slices.Equal(got.Frequencies, []int{2, 2, 1, 1}) || got.TreeSizes[ia][ra] != 5 || got.TreeSizes[ib][rb] != 4 {
					return "still " + body
				}
				return ""
			})
			if !(got.Scores[ia][ra] > got.Scores[ib][rb]) {
				t.Fatalf("scores %v: want instance %s rank %s above instance %s rank %s", got.Scores, ia, ra, ib, rb)
			}

			// The same by hash: Dynamo's block_hashes are its own
			// LocalBlockHashes, as its clients compute them (XXH3-64, seed
			// 1337, of each block's tokens; the function is checked against
			// hash-wasm's XXH3 in indexer's TestDynamoHashesMatchReference),
			// sent as i64. The engines' hashes are not Dynamo's: they match
			// nothing, as on Dynamo.
			code, body := dynPost(t, d, "/query_by_hash", map[string]any{"block_hashes": dynamoHashes(req4), "model_name": modelName})
			var byHash dynScores
			if code != http.StatusOK || json.Unmarshal([]byte(body), &byHash) != nil || fmt.Sprint(byHash) != fmt.Sprint(got) {
				t.Errorf("POST /query_by_hash: %d %s, want the /query answer %+v", code, body, got)
			}
			if code, body := dynPost(t, d, "/query_by_hash", map[string]any{"block_hashes": signed(engineHashes(t, req4)), "model_name": modelName}); code != http.StatusOK ||
				strings.TrimSpace(body) != `{"scores":{},"frequencies":[],"tree_sizes":{}}` {
				t.Errorf("POST /query_by_hash with engine hashes: %d %s, want 200 and nothing matched", code, body)
			}

			// The dump, as _test_router_decisions counts it: 5 store events
			// for a (A, B, C, D, F), 4 for b (A, C, E, G), each parent
			// stored before its children, tokens_hash Dynamo's hash.
			checkDump(t, d, modelName, map[string]int{ia + "/" + ra: 5, ib + "/" + rb: 4}, cat(A, C, D, F))

			// b offloads D and F to CPU (vLLM's medium "CPU"): Mooncake's
			// form counts them for b, Dynamo's does not (its scores read the
			// device tier), so its answer is unchanged.
			hs := engineHashes(t, req4)
			pb.Send(pypub.Batch{Topic: "", Seq: sb, Form: "array", Events: []pypub.Event{{Type: "BlockStored", BlockHashes: hs[2:], ParentHash: &hs[1],
				TokenIDs: req4[2*blockSize:], BlockSize: blockSize, Medium: "CPU"}}})
			sb++
			wait.Until(t, "b's CPU blocks in Mooncake's answer", func() string {
				code, body := dynPost(t, d, "/query", map[string]any{"token_ids": req4, "model": modelName})
				var m map[string]map[string]struct {
					CPU int `json:"CPU"`
					DP  map[string]int
				}
				if code != http.StatusOK || json.Unmarshal([]byte(body), &m) != nil || m["default"][ib].DP[rb] != 4*blockSize {
					return fmt.Sprintf("%d %s", code, body)
				}
				return ""
			})
			if code, body := dynPost(t, d, "/query", map[string]any{"token_ids": req4, "model_name": modelName}); code != http.StatusOK ||
				json.Unmarshal([]byte(body), &got) != nil || got.Scores[ib][rb] != 2*blockSize || got.Scores[ia][ra] != 4*blockSize {
				t.Errorf("Dynamo's /query after b's CPU blocks: %d %s, want b at %d tokens (GPU only)", code, body, 2*blockSize)
			}

			// Unregister b (one rank in the DP layout, the instance
			// otherwise): its blocks leave the answer, a's stay.
			unreg := map[string]any{"instance_id": tc.idb, "model_name": modelName}
			if tc.dpRank {
				unreg["dp_rank"] = tc.rkb
			}
			if code, body := dynPost(t, d, "/unregister", unreg); code != http.StatusOK || strings.TrimSpace(body) != `{"status":"ok"}` {
				t.Fatalf("unregister: %d %s", code, body)
			}
			wait.Until(t, "b leaves the answer", func() string {
				_, body := dynPost(t, d, "/query", map[string]any{"token_ids": req4, "model_name": modelName})
				var s dynScores
				_ = json.Unmarshal([]byte(body), &s)
				if _, held := s.Scores[ib][rb]; held || s.Scores[ia][ra] != 4*blockSize {
					return "still " + body
				}
				return ""
			})
			if code, body := dynPost(t, d, "/unregister", unreg); code != http.StatusNotFound || !strings.Contains(body, `"error"`) {
				t.Errorf("second unregister: %d %s, want 404 with an error", code, body)
			}
			want = map[uint64]map[int]string{tc.ida: {tc.ranka: addrA}}
			if msg := workersActive(d, want); msg != "" {
				t.Errorf("after unregister: %s", msg)
			}
		})
	}
}

// dynamoHashes are Dynamo's LocalBlockHashes of tokens' full blocks, as
// i64 (Dynamo's QueryByHashRequest.block_hashes).
func dynamoHashes(tokens []uint32) []int64 {
	hs, _ := indexer.AppendDynamoHashes(nil, nil, tokens, blockSize, indexer.DynamoSeed)
	return signed(hs)
}

func signed(hs []uint64) []int64 {
	out := make([]int64, len(hs))
	for i, h := range hs {
		out[i] = int64(h)
	}
	return out
}

// checkDump reads GET /dump as Dynamo's recovery reads it (a map of
// "model:tenant" to block_size and RouterEvents) and checks the events per
// worker/rank, that every event's parent was stored before it for its
// worker, and that the first blocks of path carry Dynamo's hashes.
func checkDump(t *testing.T, d *harness.Daemon, modelName string, want map[string]int, path []uint32) {
	t.Helper()
	code, body := d.Get("/dump")
	var dump map[string]struct {
		BlockSize int `json:"block_size"`
		Events    []struct {
			WorkerID uint64 `json:"worker_id"`
			Event    struct {
				EventID uint64 `json:"event_id"`
				Data    struct {
					Stored *struct {
						ParentHash *uint64 `json:"parent_hash"`
						Blocks     []struct {
							BlockHash  uint64 `json:"block_hash"`
							TokensHash uint64 `json:"tokens_hash"`
						} `json:"blocks"`
					} `json:"stored"`
				} `json:"data"`
				DPRank int `json:"dp_rank"`
			} `json:"event"`
		} `json:"events"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &dump) != nil {
		t.Fatalf("GET /dump: %d %s", code, body)
	}
	entry, ok := dump[modelName+":default"]
	if !ok || entry.BlockSize != blockSize {
		t.Fatalf("GET /dump has no %q with block_size %d: %s", modelName+":default", blockSize, body)
	}
	got := map[string]int{}
	stored := map[string]bool{}
	locals := map[uint64]uint64{}
	for i, ev := range entry.Events {
		st := ev.Event.Data.Stored
		if st == nil || len(st.Blocks) != 1 || ev.Event.EventID != uint64(i) {
			t.Fatalf("event %d is not one stored block numbered %d: %s", i, i, body)
		}
		w := fmt.Sprintf("%d/%d", ev.WorkerID, ev.Event.DPRank)
		if st.ParentHash != nil && !stored[fmt.Sprintf("%s/%d", w, *st.ParentHash)] {
			t.Errorf("event %d of %s names parent %d before storing it", i, w, *st.ParentHash)
		}
		stored[fmt.Sprintf("%s/%d", w, st.Blocks[0].BlockHash)] = true
		locals[st.Blocks[0].BlockHash] = st.Blocks[0].TokensHash
		got[w]++
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dump events per worker/rank %v, want %v", got, want)
	}
	for i, h := range engineHashes(t, path) {
		if l := dynamoHashes(path)[i]; locals[h] != uint64(l) {
			t.Errorf("block %d: tokens_hash %d, want Dynamo's %d", i, locals[h], uint64(l))
		}
	}
}

// TestPromiseDynamoIndexerErrors: Dynamo's statuses and error bodies, and
// the limits kvindexd adds (the endpoint policy of /v1/endpoints, tenant
// ids and model names that would make a tenant's namespace ambiguous).
func TestPromiseDynamoIndexerErrors(t *testing.T) {
	t.Parallel()
	off := harness.Start(t)
	if code, body := dynPost(t, off, "/register", map[string]any{"instance_id": 1, "endpoint": "tcp://127.0.0.1:1",
		"model_name": model, "block_size": blockSize}); code != http.StatusForbidden || !strings.Contains(body, "--admin-api") {
		t.Errorf("register without --admin-api: %d %s, want 403 naming --admin-api", code, body)
	}

	d := harness.Start(t, "--admin-api", "--allowed-endpoint-cidrs", "127.0.0.0/8")
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	reg := map[string]any{"instance_id": 5, "endpoint": addr, "model_name": model, "block_size": blockSize}
	if code, body := dynPost(t, d, "/register", reg); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	for _, c := range []struct {
		method, path string
		body         any
		status       int
		want         string
	}{
		// Dynamo: a registry refusal is 409, a bad address 400.
		{"POST", "/register", reg, http.StatusConflict, "already registered"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": addr, "model_name": model, "block_size": 32}, http.StatusConflict, "blocks of 16"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": "tcp://10.1.2.3:5557", "model_name": model, "block_size": blockSize}, http.StatusBadRequest, "allowed-endpoint-cidrs"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": "udp://127.0.0.1:5557", "model_name": model, "block_size": blockSize}, http.StatusBadRequest, "not allowed"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": addr, "model_name": model, "block_size": blockSize, "tenant_id": `team\\a`}, http.StatusBadRequest, "not allowed in a tenant id"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": addr, "model_name": `team\\m`, "block_size": blockSize}, http.StatusBadRequest, "backslash is reserved"},
		{"POST", "/register", map[string]any{"instance_id": 6, "endpoint": addr, "model_name": model, "block_size": blockSize, "tenant_id": "a", "routing_group": "b"}, http.StatusBadRequest, "differ"},
		{"POST", "/query", map[string]any{"token_ids": prompt(1, 1), "model_name": "no/such-model"}, http.StatusNotFound, "no indexer for model=no/such-model tenant=default"},
		// A tenant with no worker for the model has no indexer for it, even
		// though the default tenant has one.
		{"POST", "/query", map[string]any{"token_ids": prompt(1, 1), "model_name": model, "tenant_id": "team-a"}, http.StatusNotFound, "tenant=team-a"},
		{"POST", "/query_by_hash", map[string]any{"block_hashes": []int64{-1}, "model_name": model, "routing_group": "team-a"}, http.StatusNotFound, "tenant=team-a"},
		{"POST", "/query", map[string]any{"token_ids": prompt(1, 1), "model_name": model, "model": model}, http.StatusBadRequest, "not both"},
		{"POST", "/unregister", map[string]any{"instance_id": 9, "model_name": model}, http.StatusNotFound, "not registered"},
		{"POST", "/unregister", map[string]any{"instance_id": 5, "model_name": model, "tenant_id": "team-a"}, http.StatusNotFound, "tenant=team-a"},
		{"GET", "/workers?tenant_id=a%20b", nil, http.StatusBadRequest, "not allowed in a tenant id"},
	} {
		var code int
		var body string
		if c.method == "GET" {
			code, body = d.Get(c.path)
		} else {
			code, body = dynPost(t, d, c.path, c.body)
		}
		var e struct{ Error string }
		if code != c.status || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s %s %v: %d %s, want %d with an error containing %q", c.method, c.path, c.body, code, body, c.status, c.want)
		}
	}
	// Bodies Dynamo's server (axum's Json extractor) refuses before its
	// handler: 415 without a JSON Content-Type, 400 for what is not JSON,
	// 422 for JSON of the wrong shape (a missing field, a wrong type, a
	// number out of range), each a plain-text message; unknown fields are
	// ignored. (An admin call without a JSON Content-Type is refused by
	// kvindexd's admin guard first, 415 with its JSON error: checked
	// below.)
	for _, c := range []struct {
		path, ctype, body string
		status            int
		want              string
	}{
		{"/query", "application/x-www-form-urlencoded", `{"token_ids":[1],"model_name":"m"}`, http.StatusUnsupportedMediaType, "Content-Type: application/json"},
		{"/register", "application/json", `{"instance_id":6,`, http.StatusBadRequest, "Failed to parse the request body as JSON"},
		{"/query_by_hash", "application/json; charset=utf-8", `{"block_hashes":[1] "model_name":"m"}`, http.StatusBadRequest, "Failed to parse the request body as JSON"},
		{"/register", "application/json", `{"instance_id":-6,"endpoint":"` + addr + `","model_name":"m","block_size":16}`, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body"},
		{"/register", "application/json", `{"instance_id":"6","endpoint":"` + addr + `","model_name":"m","block_size":16}`, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body"},
		{"/register", "application/json", `{"instance_id":6,"model_name":"m","block_size":16}`, http.StatusUnprocessableEntity, "missing field `endpoint`"},
		{"/unregister", "application/json", `{"instance_id":6}`, http.StatusUnprocessableEntity, "missing field `model_name`"},
		{"/query", "application/json", `{"model_name":"m"}`, http.StatusUnprocessableEntity, "missing field `token_ids`"},
		{"/query", "application/json", `{"model_name":"m","token_ids":[4294967296]}`, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body"},
		{"/query_by_hash", "application/vnd.api+json", `{"model_name":"m","block_hashes":[18446744073709551615]}`, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body"},
		{"/query_by_hash", "application/json", `{"model_name":"m","block_hashes":[1.5]}`, http.StatusUnprocessableEntity, "Failed to deserialize the JSON body"},
	} {
		req, _ := http.NewRequest("POST", "http://"+d.HTTP+c.path, strings.NewReader(c.body))
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("POST %s %s (%s): %d %q, want %d with %q in plain text", c.path, c.body, c.ctype, resp.StatusCode, b, c.status, c.want)
		}
	}
	if code, body, _ := d.Do("POST", "/register", ""); code != http.StatusUnsupportedMediaType || !strings.Contains(body, "application/json") {
		t.Errorf("register without a Content-Type: %d %s, want 415", code, body)
	}
	// Unknown fields are ignored, as serde ignores them.
	if code, body := dynPost(t, d, "/register", map[string]any{"instance_id": 7, "endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t)),
		"model_name": model, "block_size": blockSize, "lora_name": "x", "future_field": []int{1}}); code != http.StatusCreated {
		t.Errorf("register with unknown fields: %d %s, want 201", code, body)
	}
	if code, body := dynPost(t, d, "/query", map[string]any{"token_ids": prompt(1, 1), "model_name": model, "cache_salt": "s", "x": 1}); code != http.StatusOK {
		t.Errorf("query with unknown fields: %d %s, want 200", code, body)
	}
	if code, body := off.Get("/dump"); code != http.StatusForbidden {
		t.Errorf("GET /dump without --admin-api: %d %s, want 403 (the whole index, admin scope as the peer snapshot)", code, body)
	}

	// Dynamo's peer registry: a set of URLs, listed in order, registered
	// twice as once (201), removed once (200, then 404 "peer not found");
	// admin scope.
	peer := map[string]any{"url": "http://10.0.0.9:8090"}
	for i := 0; i < 2; i++ {
		if code, body := dynPost(t, d, "/register_peer", peer); code != http.StatusCreated || strings.TrimSpace(body) != `{"status":"ok"}` {
			t.Errorf("register_peer: %d %s, want 201", code, body)
		}
	}
	if code, body := d.Get("/peers"); code != http.StatusOK || strings.TrimSpace(body) != `["http://10.0.0.9:8090"]` {
		t.Errorf("GET /peers: %d %s", code, body)
	}
	if code, body := dynPost(t, d, "/deregister_peer", peer); code != http.StatusOK {
		t.Errorf("deregister_peer: %d %s, want 200", code, body)
	}
	if code, body := dynPost(t, d, "/deregister_peer", peer); code != http.StatusNotFound || !strings.Contains(body, `"error":"peer not found"`) {
		t.Errorf("second deregister_peer: %d %s, want 404 peer not found", code, body)
	}
	if code, body := d.Get("/peers"); code != http.StatusOK || strings.TrimSpace(body) != `[]` {
		t.Errorf("GET /peers after: %d %s", code, body)
	}
	if code, body := dynPost(t, off, "/register_peer", peer); code != http.StatusForbidden {
		t.Errorf("register_peer without --admin-api: %d %s, want 403", code, body)
	}

	// A known model with nothing cached: 200 and empty maps, as Dynamo's.
	if code, body := dynPost(t, d, "/query", map[string]any{"token_ids": prompt(1, 2), "model_name": model, "tenant_id": "default"}); code != http.StatusOK ||
		strings.TrimSpace(body) != `{"scores":{},"frequencies":[],"tree_sizes":{}}` {
		t.Errorf("query with nothing cached: %d %s", code, body)
	}
	if code, body := d.Get("/health"); code != http.StatusOK || body != "" {
		t.Errorf("GET /health: %d %q, want 200 and no body", code, body)
	}
	if v := d.Metric(`kvindexd_dynamo_register_rejected_total{reason="duplicate"}`); v != 1 {
		t.Errorf(`kvindexd_dynamo_register_rejected_total{reason="duplicate"} = %v, want 1`, v)
	}
	if v := d.Metric("kvindexd_dynamo_registrations"); v != 2 {
		t.Errorf("kvindexd_dynamo_registrations = %v, want 2", v)
	}
}
