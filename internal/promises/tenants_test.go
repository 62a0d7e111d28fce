package promises

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// TestPromiseTenantsIsolated: tenants are namespaces (docs/security.md,
// Tenants). Two tenants and the default one each register a worker (a real
// libzmq publisher) for the same model, and all three publish the same
// blocks; each tenant's query, in Dynamo's form and Mooncake's, counts its
// own worker only. In memory and in Redis (a redis-server of the test's
// own). /workers and /unregister see one tenant at a time, and with
// --max-tenants 2 a third tenant is refused, counted and not subscribed.
func TestPromiseTenantsIsolated(t *testing.T) {
	t.Parallel()
	pypub.RequirePython(t)
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			args := []string{"--admin-api", "--max-tenants", "2"}
			if backend == "redis" {
				args = append(args, "--index", redistest.Start(t).URL())
			}
			d := harness.Start(t, args...)
			tenantsIsolated(t, d)
		})
	}
}

func tenantsIsolated(t *testing.T, d *harness.Daemon) {
	const modelName = "tenants/shared-model"
	blocks := dynBlocks()
	shared := cat(blocks[0], blocks[1], blocks[2])
	workers := []struct {
		tenant string // "" sends no tenant_id: the default tenant
		id     uint64
		pub    *pypub.Publisher
		addr   string
	}{{tenant: "team-a", id: 101}, {tenant: "team-b", id: 202}, {tenant: "", id: 303}}
	want := map[uint64]map[int]string{}
	for i := range workers {
		w := &workers[i]
		w.addr = fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
		w.pub = pypub.StartPublisher(t, w.addr, true)
		body := map[string]any{"instance_id": w.id, "endpoint": w.addr, "model_name": modelName, "block_size": blockSize}
		if w.tenant != "" {
			body["tenant_id"] = w.tenant
		}
		if code, resp := dynPost(t, d, "/register", body); code != http.StatusCreated {
			t.Fatalf("register %d for tenant %q: %d %s", w.id, w.tenant, code, resp)
		}
		want[w.id] = map[int]string{0: w.addr}
	}
	wait.Until(t, "the three listeners are active", func() string { return workersActive(d, want) })
	for i := range workers {
		workers[i].pub.WaitReady(harness.ReadyLimit)
		var seq uint64
		dynStore(t, workers[i].pub, &seq, shared, 0)
	}

	// Each tenant sees its own worker's 3 blocks and no other worker.
	for _, w := range workers {
		id := strconv.FormatUint(w.id, 10)
		q := map[string]any{"token_ids": shared, "model_name": modelName}
		tn := "default"
		if w.tenant != "" {
			q["tenant_id"], tn = w.tenant, w.tenant
		}
		wait.Until(t, "tenant "+tn+"'s Dynamo answer", func() string {
			code, body := dynPost(t, d, "/query", q)
			var s dynScores
			if code != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil {
				return fmt.Sprintf("%d %s", code, body)
			}
			if len(s.Scores) != 1 || s.Scores[id]["0"] != 3*blockSize {
				return "want only " + id + " with 3 blocks: " + body
			}
			return ""
		})
		// Mooncake's form: tenant_id selects the same namespace.
		mq := map[string]any{"token_ids": shared, "model": modelName, "tenant_id": tn}
		code, body := dynPost(t, d, "/query", mq)
		var m map[string]map[string]map[string]any
		if code != http.StatusOK || json.Unmarshal([]byte(body), &m) != nil || len(m) != 1 || len(m[tn]) != 1 || m[tn][id]["longest_matched"] != float64(3*blockSize) {
			t.Errorf("Mooncake /query for tenant %s: %d %s, want only %s with %d tokens", tn, code, body, id, 3*blockSize)
		}
	}

	// /workers filters by tenant and names each worker's tenant.
	code, body := d.Get("/workers?tenant_id=team-a")
	var listed []struct {
		InstanceID uint64 `json:"instance_id"`
		TenantID   string `json:"tenant_id"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &listed) != nil || len(listed) != 1 || listed[0].InstanceID != 101 || listed[0].TenantID != "team-a" {
		t.Errorf("GET /workers?tenant_id=team-a: %d %s, want worker 101 of team-a only", code, body)
	}

	// The cap: team-a and team-b are the 2 tenants --max-tenants allows
	// besides the default one, so a third is refused and counted.
	extra := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	code, body = dynPost(t, d, "/register", map[string]any{"instance_id": 404, "endpoint": extra, "model_name": modelName,
		"block_size": blockSize, "tenant_id": "team-c"})
	if code != http.StatusConflict || !strings.Contains(body, "--max-tenants") {
		t.Errorf("register a third tenant: %d %s, want 409 naming --max-tenants", code, body)
	}
	if v := d.Metric(`kvindexd_dynamo_register_rejected_total{reason="tenant_limit"}`); v != 1 {
		t.Errorf(`kvindexd_dynamo_register_rejected_total{reason="tenant_limit"} = %v, want 1`, v)
	}
	if v := d.Metric("kvindexd_dynamo_tenants"); v != 2 {
		t.Errorf("kvindexd_dynamo_tenants = %v, want 2", v)
	}
	// More workers for a tenant already holding some are within the cap.
	code, body = dynPost(t, d, "/register", map[string]any{"instance_id": 102, "endpoint": extra, "model_name": modelName,
		"block_size": blockSize, "tenant_id": "team-a"})
	if code != http.StatusCreated {
		t.Errorf("register a second worker for team-a: %d %s, want 201", code, body)
	}

	// /unregister with a tenant removes that tenant's workers only: team-b
	// cannot remove team-a's, and team-a leaving frees a tenant slot.
	if code, body := dynPost(t, d, "/unregister", map[string]any{"instance_id": 101, "model_name": modelName, "tenant_id": "team-b"}); code != http.StatusNotFound {
		t.Errorf("unregister team-a's worker as team-b: %d %s, want 404", code, body)
	}
	for _, id := range []int{101, 102} {
		if code, body := dynPost(t, d, "/unregister", map[string]any{"instance_id": id, "model_name": modelName, "tenant_id": "team-a"}); code != http.StatusOK {
			t.Fatalf("unregister %d of team-a: %d %s", id, code, body)
		}
	}
	if v := d.Metric("kvindexd_dynamo_tenants"); v != 1 {
		t.Errorf("kvindexd_dynamo_tenants after team-a left = %v, want 1", v)
	}
	// team-b's answer is unchanged by team-a leaving.
	code, body = dynPost(t, d, "/query", map[string]any{"token_ids": shared, "model_name": modelName, "tenant_id": "team-b"})
	if sb := (dynScores{}); code != http.StatusOK || json.Unmarshal([]byte(body), &sb) != nil || len(sb.Scores) != 1 || sb.Scores["202"]["0"] != 3*blockSize {
		t.Errorf("team-b after team-a left: %d %s", code, body)
	}
}

// TestPromiseTenantsShareEngine: one engine serves two tenants (docs/api.md,
// NVIDIA Dynamo). Its address is registered for team-a as instance 501 and
// for team-b as instance 502, as Dynamo accepts it: both are 201, the
// daemon reads the engine through one subscription
// (kvindexd_kvevents_shared_endpoint_views 1), and each tenant's query
// counts its own worker only. An (instance_id, dp_rank) registered for one
// tenant is 409 for another, as Dynamo keys workers by instance alone.
// Unregistering team-a leaves team-b's worker fed by the same engine. At
// most 256 registrations share one address: one more is 409.
func TestPromiseTenantsShareEngine(t *testing.T) {
	t.Parallel()
	pypub.RequirePython(t)
	d := harness.Start(t, "--admin-api")
	const modelName = "tenants/one-engine"
	blocks := dynBlocks()
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pub := pypub.StartPublisher(t, addr, true)
	ids := map[string]uint64{"team-a": 501, "team-b": 502}
	want := map[uint64]map[int]string{}
	for _, tn := range []string{"team-a", "team-b"} {
		body := map[string]any{"instance_id": ids[tn], "endpoint": addr, "model_name": modelName, "block_size": blockSize, "tenant_id": tn}
		if code, resp := dynPost(t, d, "/register", body); code != http.StatusCreated {
			t.Fatalf("register %s's worker at the shared engine address: %d %s, want 201", tn, code, resp)
		}
		want[ids[tn]] = map[int]string{0: addr}
	}
	code, body := dynPost(t, d, "/register", map[string]any{"instance_id": 501, "endpoint": addr, "model_name": modelName,
		"block_size": blockSize, "tenant_id": "team-b"})
	if code != http.StatusConflict || !strings.Contains(body, "already registered") {
		t.Errorf("register team-a's instance 501 again for team-b: %d %s, want 409 already registered", code, body)
	}
	wait.Until(t, "both listeners are active", func() string { return workersActive(d, want) })
	if v := d.Metric("kvindexd_kvevents_shared_endpoint_views"); v != 1 {
		t.Errorf("kvindexd_kvevents_shared_endpoint_views = %v, want 1 (the second tenant reads the first one's subscription)", v)
	}
	pub.WaitReady(harness.ReadyLimit)
	var seq uint64
	dynStore(t, pub, &seq, cat(blocks[0], blocks[1]), 0)
	tokens := cat(blocks[0], blocks[1], blocks[2])
	answer := func(tn string, wantBlocks int) string {
		code, body := dynPost(t, d, "/query", map[string]any{"token_ids": tokens, "model_name": modelName, "tenant_id": tn})
		var s dynScores
		if code != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil {
			return fmt.Sprintf("%d %s", code, body)
		}
		id := strconv.FormatUint(ids[tn], 10)
		if len(s.Scores) != 1 || s.Scores[id]["0"] != wantBlocks*blockSize {
			return fmt.Sprintf("want only %s with %d blocks: %s", id, wantBlocks, body)
		}
		return ""
	}
	for _, tn := range []string{"team-a", "team-b"} {
		wait.Until(t, tn+"'s answer from the shared engine", func() string { return answer(tn, 2) })
	}

	if code, body := dynPost(t, d, "/unregister", map[string]any{"instance_id": 501, "model_name": modelName, "tenant_id": "team-a"}); code != http.StatusOK {
		t.Fatalf("unregister team-a's worker: %d %s", code, body)
	}
	dynStore(t, pub, &seq, tokens, 2)
	wait.Until(t, "team-b's worker still fed after team-a left", func() string { return answer("team-b", 3) })
	if v := d.Metric("kvindexd_kvevents_shared_endpoint_views"); v != 0 {
		t.Errorf("kvindexd_kvevents_shared_endpoint_views after team-a left = %v, want 0", v)
	}
	if code, body := dynPost(t, d, "/query", map[string]any{"token_ids": tokens, "model_name": modelName, "tenant_id": "team-a"}); code != http.StatusNotFound {
		t.Errorf("team-a's query after its only worker left: %d %s, want 404 (no indexer)", code, body)
	}

	// The cap: 256 registrations share one address (each decodes every
	// message the engine sends); one more is 409 and not subscribed.
	for id := 1000; id < 1255; id++ {
		body := map[string]any{"instance_id": id, "endpoint": addr, "model_name": modelName, "block_size": blockSize, "tenant_id": "team-b"}
		if code, resp := dynPost(t, d, "/register", body); code != http.StatusCreated {
			t.Fatalf("register sharer %d of the address: %d %s", id, code, resp)
		}
	}
	if v := d.Metric("kvindexd_kvevents_shared_endpoint_views"); v != 255 {
		t.Errorf("kvindexd_kvevents_shared_endpoint_views with 256 sharers = %v, want 255", v)
	}
	code, body = dynPost(t, d, "/register", map[string]any{"instance_id": 2000, "endpoint": addr, "model_name": modelName,
		"block_size": blockSize, "tenant_id": "team-b"})
	if code != http.StatusConflict || !strings.Contains(body, "share this address, the limit") {
		t.Errorf("a 257th registration of one address: %d %s, want 409 naming the limit", code, body)
	}
	if v := d.Metric(`kvindexd_dynamo_register_rejected_total{reason="subscribe"}`); v != 1 {
		t.Errorf(`kvindexd_dynamo_register_rejected_total{reason="subscribe"} = %v, want 1`, v)
	}
}
