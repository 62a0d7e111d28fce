package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/tenant"
	"github.com/kvindex/kvindex/kvevents"
)

// NVIDIA Dynamo's standalone KV indexer (dynamo-kv-indexer) HTTP API, served
// on the HTTP port so a router written for it works unchanged: POST
// /register and /unregister (runtime ZMQ subscriptions, admin scope, the
// same endpoint policy as POST /v1/endpoints), GET /workers, GET /health,
// GET /dump, and the Dynamo forms of POST /query and /query_by_hash (told
// from Mooncake's by model_name, see mooncake.go). The shapes, statuses and
// error bodies follow Dynamo's server code, lib/kv-router/src/
// standalone_indexer/server.rs at ai-dynamo/dynamo@bc2583516003 (the
// version with tenant_id; docs/api.md lists where kvindexd differs).
//
// A registered worker is the pod named by its instance_id in decimal, so
// Mooncake's instance_id filter and /v1/pods name it the same way; each
// (instance_id, dp_rank) is one endpoint whose batches without a
// data_parallel_rank are that rank's (kvevents.EndpointConfig.DPRank).

// Tenants (tenant_id, or routing_group, Dynamo's later name for the same
// partition) are namespaces of models (internal/tenant): a worker
// registered for tenant T and model M is subscribed under the model name
// tenant.Model(T, M), and a query for (T, M) reads that name only, so no
// tenant's answer counts another tenant's blocks, in memory or in Redis.
// At most Config.MaxTenants tenants besides the default one hold
// registrations at a time (kvindexd_dynamo_tenants).

// DefaultMaxRegistrations caps the workers registered through POST
// /register when Config.MaxRegistrations is 0 (kvindexd passes
// --max-streams: a registration is at least one (pod, rank) stream, so more
// could never be indexed).
const DefaultMaxRegistrations = kvevents.DefaultMaxStreams

// maxRegisterBody bounds a /register or /unregister body: a few short
// strings and numbers.
const maxRegisterBody = 64 << 10

// dynKey names one registration: Dynamo keys its listeners by instance and
// dp_rank within a (model, tenant) indexer.
type dynKey struct {
	tenant   string
	model    string
	instance uint64
	rank     int
}

type dynWorker struct {
	address   string
	replay    string
	blockSize int
}

// dynRegistry is what POST /register added, for /workers and /unregister.
// It is capped (Config.MaxRegistrations) and counted
// (kvindexd_dynamo_registrations).
type dynRegistry struct {
	mu      sync.Mutex
	workers map[dynKey]dynWorker
}

type dynamoMetrics struct {
	registrations prometheus.GaugeFunc
	tenants       prometheus.GaugeFunc
	rejected      *prometheus.CounterVec
}

func newDynamoMetrics(reg *prometheus.Registry, r *dynRegistry) (*dynamoMetrics, error) {
	m := &dynamoMetrics{
		registrations: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindexd_dynamo_registrations",
			Help: "Workers (instance, dp_rank) registered through Dynamo's POST /register; at most --max-streams.",
		}, func() float64 { r.mu.Lock(); defer r.mu.Unlock(); return float64(len(r.workers)) }),
		tenants: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindexd_dynamo_tenants",
			Help: "Tenants other than \"default\" holding workers registered through Dynamo's POST /register; at most --max-tenants.",
		}, func() float64 { r.mu.Lock(); defer r.mu.Unlock(); return float64(r.tenantsLocked("")) }),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_dynamo_register_rejected_total",
			Help: "Dynamo POST /register calls refused, by reason (invalid, tenant, tenant_limit, policy, block_size, duplicate, limit, subscribe).",
		}, []string{"reason"}),
	}
	for _, r := range []string{"invalid", "tenant", "tenant_limit", "policy", "block_size", "duplicate", "limit", "subscribe"} {
		m.rejected.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.registrations, m.tenants, m.rejected} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// tenantsLocked counts the tenants other than the default holding
// registrations, plus extra when it is a tenant holding none yet (the
// count a registration for it would make). r.mu is held.
func (r *dynRegistry) tenantsLocked(extra string) int {
	seen := map[string]bool{}
	for k := range r.workers {
		if k.tenant != tenant.Default {
			seen[k.tenant] = true
		}
	}
	if extra != "" && extra != tenant.Default {
		seen[extra] = true
	}
	return len(seen)
}

func (s *Server) maxTenants() int {
	return int(Options.MaxTenants.Or(int64(s.cfg.MaxTenants)))
}

func (s *Server) maxRegistrations() int {
	if s.cfg.MaxRegistrations > 0 {
		return s.cfg.MaxRegistrations
	}
	return DefaultMaxRegistrations
}

// dynamoStatus writes Dynamo's success body {"status":"ok"}.
func dynamoStatus(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// decodeDynamo decodes a small JSON body strictly: an unknown field is a
// mistake worth a 400 naming it (Dynamo would ignore it silently).
func decodeDynamo(w http.ResponseWriter, r *http.Request, v any) *Error {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxRegisterBody)); err != nil {
		if tooBig := new(http.MaxBytesError); errors.As(err, &tooBig) {
			return errorf(codes.ResourceExhausted, "read body: %v", err)
		}
		return errorf(codes.InvalidArgument, "read body: %v", err)
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return errorf(codes.InvalidArgument, "invalid JSON body: %v", err)
	}
	return nil
}

// parseInstance reads Dynamo's instance_id, an unsigned 64-bit integer.
func parseInstance(n json.Number) (uint64, *Error) {
	if n == "" {
		return 0, errorf(codes.InvalidArgument, "instance_id is required (Dynamo's worker id, an unsigned integer)")
	}
	v, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		return 0, errorf(codes.InvalidArgument, "instance_id %s: want an unsigned 64-bit integer", n)
	}
	return v, nil
}

type dynRegisterRequest struct {
	InstanceID     json.Number `json:"instance_id"`
	Endpoint       string      `json:"endpoint"`
	ModelName      string      `json:"model_name"`
	BlockSize      int         `json:"block_size"`
	TenantID       *string     `json:"tenant_id"`
	RoutingGroup   *string     `json:"routing_group"`
	DPRank         *int        `json:"dp_rank"`
	ReplayEndpoint string      `json:"replay_endpoint"`
	// Engine is kvindexd's own addition: the wire format of the endpoint's
	// events (default vllm, which Dynamo's listener decodes).
	Engine string `json:"engine"`
}

// tenantOf reads tenant_id and routing_group (Dynamo's later name for the
// same partition): the tenant they name, "" when neither is given. Both
// given must agree.
func tenantOf(tid, group *string) (string, *Error) {
	t := ""
	for _, p := range []*string{tid, group} {
		if p == nil {
			continue
		}
		if err := tenant.Check(*p); err != nil {
			return "", errorf(codes.InvalidArgument, "%v", err)
		}
		if t != "" && t != *p {
			return "", errorf(codes.InvalidArgument, "tenant_id %q and routing_group %q differ: they name the same partition, send one", *tid, *group)
		}
		t = *p
	}
	return t, nil
}

// orDefault is t, or the default tenant for "".
func orDefault(t string) string {
	if t == "" {
		return tenant.Default
	}
	return t
}

func (s *Server) handleDynamoRegister(w http.ResponseWriter, r *http.Request) {
	reason, status, e := s.dynamoRegister(w, r)
	if e != nil {
		s.dynamo.rejected.WithLabelValues(reason).Inc()
		if status == 0 {
			status = httpStatus(e.Code)
		}
		writeErrorStatus(w, status, e)
		return
	}
	dynamoStatus(w, http.StatusCreated)
}

// dynamoRegister subscribes one (instance, dp_rank) endpoint. Statuses as
// Dynamo's: 400 for an address its validation (here: the endpoint policy)
// refuses, 409 for what its registry refuses (a duplicate, a block size
// other than the model's); 0 = the code's own.
func (s *Server) dynamoRegister(w http.ResponseWriter, r *http.Request) (reason string, status int, e *Error) {
	if !s.adminEnabled() {
		return "invalid", 0, errAdminOff
	}
	if s.cfg.Subscriber == nil {
		return "invalid", 0, errorf(codes.Unimplemented, "no event subscriber is running")
	}
	var req dynRegisterRequest
	if e := decodeDynamo(w, r, &req); e != nil {
		return "invalid", 0, e
	}
	inst, e := parseInstance(req.InstanceID)
	if e != nil {
		return "invalid", 0, e
	}
	req.Endpoint = strings.TrimSpace(req.Endpoint)
	switch {
	case req.Endpoint == "":
		return "invalid", 0, errorf(codes.InvalidArgument, "endpoint is required (the engine's ZMQ PUB address, e.g. tcp://10.0.0.7:5557)")
	case req.ModelName == "":
		return "invalid", 0, errorf(codes.InvalidArgument, "model_name is required")
	case tenant.CheckModel(req.ModelName) != nil:
		return "invalid", 0, errorf(codes.InvalidArgument, "%v", tenant.CheckModel(req.ModelName))
	case req.BlockSize <= 0:
		return "invalid", 0, errorf(codes.InvalidArgument, "block_size is required and must be positive (the engine's block size)")
	}
	rank := 0
	if req.DPRank != nil {
		rank = *req.DPRank
	}
	tn, e := tenantOf(req.TenantID, req.RoutingGroup)
	if e != nil {
		return "tenant", 0, e
	}
	tn = orDefault(tn)
	eng, ok := blockkeys.ParseEngine(req.Engine)
	if !ok {
		return "invalid", 0, errorf(codes.InvalidArgument, "engine %q: want vllm, sglang or trtllm", req.Engine)
	}
	if err := s.endpointPolicy().CheckEndpoint(r.Context(), req.Endpoint, req.ReplayEndpoint, ""); err != nil {
		return "policy", http.StatusBadRequest, errorf(codes.InvalidArgument, "%v", err)
	}
	if bs := s.idx.KeyConfig(req.ModelName).BlockSize; bs != req.BlockSize {
		return "block_size", http.StatusConflict, errorf(codes.FailedPrecondition,
			"block_size %d: model %q is indexed in blocks of %d tokens (--block-size, models.NAME.block_size)", req.BlockSize, req.ModelName, bs)
	}
	key := dynKey{tenant: tn, model: req.ModelName, instance: inst, rank: rank}
	reg := &s.dynReg
	reg.mu.Lock()
	defer reg.mu.Unlock()
	s.pruneLocked()
	// Dynamo keys its workers by instance_id alone: an (instance, rank) is
	// registered once whatever the model or tenant (a pod here is one
	// stream per rank). One engine address for several tenants is each
	// tenant's own instance_id, sharing one subscription (Share below).
	for k := range reg.workers {
		if k.instance == inst && k.rank == rank {
			return "duplicate", http.StatusConflict, errorf(codes.AlreadyExists,
				"instance %d dp_rank %d is already registered (model %q tenant %q): POST /unregister first", inst, rank, k.model, k.tenant)
		}
	}
	if n := reg.tenantsLocked(tn); n > s.maxTenants() {
		return "tenant_limit", http.StatusConflict, errorf(codes.ResourceExhausted,
			"tenant_id %q: %d tenants besides %q hold registrations, the limit (--max-tenants): POST /unregister a tenant's workers first",
			tn, n-1, tenant.Default)
	}
	if len(reg.workers) >= s.maxRegistrations() {
		return "limit", http.StatusConflict, errorf(codes.ResourceExhausted,
			"%d workers are registered, the limit (--max-streams): POST /unregister some first", len(reg.workers))
	}
	pod := strconv.FormatUint(inst, 10)
	err := s.cfg.Subscriber.AddEndpoint(kvevents.EndpointConfig{Address: req.Endpoint, Pod: pod, Model: tenant.Model(tn, req.ModelName),
		Engine: eng, ReplayAddress: req.ReplayEndpoint, DPRank: rank, AllTopics: true, Share: true})
	if err != nil {
		return "subscribe", http.StatusConflict, errorf(codes.AlreadyExists, "register instance %d dp_rank %d: %v", inst, rank, err)
	}
	if reg.workers == nil {
		reg.workers = make(map[dynKey]dynWorker)
	}
	reg.workers[key] = dynWorker{address: req.Endpoint, replay: req.ReplayEndpoint, blockSize: req.BlockSize}
	s.log.Info("dynamo worker registered", "instance_id", inst, "dp_rank", rank, "model", req.ModelName, "tenant", tn, "endpoint", req.Endpoint, "engine", eng)
	return "", 0, nil
}

// pruneLocked drops registrations whose endpoint was removed another way
// (DELETE /v1/endpoints, gRPC RemoveEndpoint). reg.mu is held.
func (s *Server) pruneLocked() {
	reg := &s.dynReg
	if len(reg.workers) == 0 {
		return
	}
	type sub struct{ address, pod string }
	live := make(map[sub]bool)
	for _, ep := range s.cfg.Subscriber.Endpoints() {
		live[sub{ep.Address, ep.Pod}] = true
	}
	for k, wk := range reg.workers {
		if !live[sub{wk.address, strconv.FormatUint(k.instance, 10)}] {
			delete(reg.workers, k)
		}
	}
}

type dynUnregisterRequest struct {
	InstanceID   json.Number `json:"instance_id"`
	ModelName    string      `json:"model_name"`
	TenantID     *string     `json:"tenant_id"`
	RoutingGroup *string     `json:"routing_group"`
	DPRank       *int        `json:"dp_rank"`
}

// handleDynamoUnregister removes an instance's registrations for a model:
// every rank, or one (dp_rank); every tenant (tenant_id absent) or the one
// named. Its endpoints are unsubscribed and
// their blocks leave the index (the subscriber clears a removed endpoint's
// streams), as Dynamo removes the worker from its tree. 404 when nothing
// matched, as Dynamo's.
func (s *Server) handleDynamoUnregister(w http.ResponseWriter, r *http.Request) {
	if e := s.dynamoUnregister(w, r); e != nil {
		writeError(w, e)
		return
	}
	dynamoStatus(w, http.StatusOK)
}

func (s *Server) dynamoUnregister(w http.ResponseWriter, r *http.Request) *Error {
	if !s.adminEnabled() {
		return errAdminOff
	}
	if s.cfg.Subscriber == nil {
		return errorf(codes.Unimplemented, "no event subscriber is running")
	}
	var req dynUnregisterRequest
	if e := decodeDynamo(w, r, &req); e != nil {
		return e
	}
	inst, e := parseInstance(req.InstanceID)
	if e != nil {
		return e
	}
	if req.ModelName == "" {
		return errorf(codes.InvalidArgument, "model_name is required")
	}
	tn, e := tenantOf(req.TenantID, req.RoutingGroup)
	if e != nil {
		return e
	}
	reg := &s.dynReg
	reg.mu.Lock()
	defer reg.mu.Unlock()
	s.pruneLocked()
	var gone []dynKey
	for k := range reg.workers {
		if k.model == req.ModelName && k.instance == inst && (req.DPRank == nil || *req.DPRank == k.rank) && (tn == "" || tn == k.tenant) {
			gone = append(gone, k)
		}
	}
	if len(gone) == 0 {
		what := fmt.Sprintf("instance %d", inst)
		if req.DPRank != nil {
			what += fmt.Sprintf(" dp_rank %d", *req.DPRank)
		}
		tenants := "any tenant"
		if tn != "" {
			tenants = "tenant=" + tn
		}
		return errorf(codes.NotFound, "%s is not registered for model=%s %s", what, req.ModelName, tenants)
	}
	for _, k := range gone {
		addr := reg.workers[k].address
		if err := s.cfg.Subscriber.RemoveEndpointPod(addr, strconv.FormatUint(k.instance, 10)); err != nil && !errors.Is(err, kvevents.ErrUnknownEndpoint) {
			return errorf(codes.Unavailable, "unregister instance %d dp_rank %d: %v", k.instance, k.rank, err)
		}
		delete(reg.workers, k)
		s.log.Info("dynamo worker unregistered", "instance_id", k.instance, "dp_rank", k.rank, "model", k.model, "tenant", k.tenant, "endpoint", addr)
	}
	return nil
}

// dynListener and dynWorkerInfo are one entry of GET /workers: Dynamo's
// fields (instance_id, endpoints by dp_rank) plus the ones its later
// versions and test harness read (source, status, listeners).
type dynListener struct {
	Endpoint string `json:"endpoint"`
	Status   string `json:"status"`
}

type dynWorkerInfo struct {
	InstanceID uint64                 `json:"instance_id"`
	Source     string                 `json:"source"`
	Status     string                 `json:"status"`
	ModelName  string                 `json:"model_name"`
	TenantID   string                 `json:"tenant_id"`
	BlockSize  int                    `json:"block_size"`
	Endpoints  map[string]string      `json:"endpoints"`
	Listeners  map[string]dynListener `json:"listeners"`
}

// handleDynamoWorkers lists the registered workers, one entry per
// (instance, model, tenant), optionally filtered by ?model_name= and
// ?tenant_id= (or ?routing_group=). A listener is
// "active" while its publisher is connected, "pending" otherwise; the
// worker's status is its worst listener's.
func (s *Server) handleDynamoWorkers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var tid, rg *string
	if q.Has("tenant_id") {
		v := q.Get("tenant_id")
		tid = &v
	}
	if q.Has("routing_group") {
		v := q.Get("routing_group")
		rg = &v
	}
	tn, e := tenantOf(tid, rg)
	if e != nil {
		writeError(w, e)
		return
	}
	model := q.Get("model_name")
	connected := map[string]bool{}
	if s.cfg.Subscriber != nil {
		for _, ep := range s.cfg.Subscriber.Endpoints() {
			connected[ep.Address] = ep.Connected
		}
	}
	type group struct {
		tenant   string
		model    string
		instance uint64
	}
	byGroup := map[group]*dynWorkerInfo{}
	reg := &s.dynReg
	reg.mu.Lock()
	for k, wk := range reg.workers {
		c, live := connected[wk.address]
		if !live || (model != "" && k.model != model) || (tn != "" && k.tenant != tn) {
			continue
		}
		g := group{k.tenant, k.model, k.instance}
		info := byGroup[g]
		if info == nil {
			info = &dynWorkerInfo{InstanceID: k.instance, Source: "zmq", Status: "active", ModelName: k.model,
				TenantID: k.tenant, BlockSize: wk.blockSize, Endpoints: map[string]string{}, Listeners: map[string]dynListener{}}
			byGroup[g] = info
		}
		st := "active"
		if !c {
			st, info.Status = "pending", "pending"
		}
		rank := strconv.Itoa(k.rank)
		info.Endpoints[rank] = wk.address
		info.Listeners[rank] = dynListener{Endpoint: wk.address, Status: st}
	}
	reg.mu.Unlock()
	out := make([]*dynWorkerInfo, 0, len(byGroup))
	for _, info := range byGroup {
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b *dynWorkerInfo) int {
		if c := cmp.Compare(a.InstanceID, b.InstanceID); c != 0 {
			return c
		}
		if c := cmp.Compare(a.ModelName, b.ModelName); c != 0 {
			return c
		}
		return cmp.Compare(a.TenantID, b.TenantID)
	})
	writeJSON(w, http.StatusOK, out)
}

// handleDynamoDump answers GET /dump with 501: Dynamo's dump is its radix
// tree replayed as RouterEvents (parent hash, engine block hash and token
// hash per block), which peers load to recover. kvindexd's index keeps
// neither parent links nor token hashes, so it cannot write that dump, and
// an approximation a Dynamo peer would load as truth is worse than none.
func (s *Server) handleDynamoDump(w http.ResponseWriter, _ *http.Request) {
	writeError(w, errorf(codes.Unimplemented, "GET /dump (Dynamo's RouterEvent tree dump) is not served: kvindexd's index keeps "+
		"no parent links or token hashes to rebuild it from; per-pod block counts are in GET /v1/pods"))
}

// modelKnown reports whether model (an internal name, tenant.Model) has an
// index here in Dynamo's sense: a worker registered for it, an endpoint or
// a stream of it. Dynamo answers 404 for a query naming a (model, tenant)
// it has no indexer for.
func (s *Server) modelKnown(model string) bool {
	reg := &s.dynReg
	reg.mu.Lock()
	for k := range reg.workers {
		if tenant.Model(k.tenant, k.model) == model {
			reg.mu.Unlock()
			return true
		}
	}
	reg.mu.Unlock()
	if s.cfg.Subscriber == nil {
		return false
	}
	for _, ep := range s.cfg.Subscriber.Endpoints() {
		if ep.Model == model {
			return true
		}
	}
	for _, st := range s.cfg.Subscriber.Streams() {
		if st.Model == model {
			return true
		}
	}
	return false
}

// appendDynamoScores writes Dynamo's score answer: scores (matched tokens
// by instance then dp_rank, only ranks matching at least one block, as
// Dynamo lists only workers its tree walk met), frequencies (per matched
// block depth, how many (instance, rank) hold the prefix that deep) and
// tree_sizes (blocks each listed rank holds).
func appendDynamoScores(b []byte, res *indexer.Result, sizes map[indexer.PodRef]int64) []byte {
	bs := int64(res.BlockSize)
	deepest := 0
	b = append(b, `{"scores":`...)
	b = appendByRank(b, res, func(pod string, rk indexer.RankScore) int64 {
		deepest = max(deepest, rk.MatchedBlocks)
		return int64(rk.MatchedBlocks) * bs
	})
	b = append(b, `,"frequencies":[`...)
	for d := 0; d < deepest; d++ {
		if d > 0 {
			b = append(b, ',')
		}
		c := 0
		for i := range res.Pods {
			for _, rk := range res.Pods[i].Ranks {
				if rk.MatchedBlocks > d {
					c++
				}
			}
		}
		b = strconv.AppendInt(b, int64(c), 10)
	}
	b = append(b, `],"tree_sizes":`...)
	b = appendByRank(b, res, func(pod string, rk indexer.RankScore) int64 {
		return max(sizes[indexer.PodRef{Name: pod, DPRank: rk.DPRank}], 0)
	})
	return append(b, "}\n"...)
}

// appendByRank writes {"<pod>": {"<dp_rank>": value, ...}, ...} over the
// ranks of res that match at least one block (Dynamo lists only the
// workers its tree walk met).
func appendByRank(b []byte, res *indexer.Result, value func(pod string, rk indexer.RankScore) int64) []byte {
	b = append(b, '{')
	first := true
	for i := range res.Pods {
		p := &res.Pods[i]
		if p.MatchedBlocks == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, p.Pod)
		b = append(b, ":{"...)
		n := 0
		for _, rk := range p.Ranks {
			if rk.MatchedBlocks == 0 {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(rk.DPRank), 10)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, value(p.Pod, rk), 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// treeSizes reads the block count of every (pod, rank) in res that
// matched: one pod listing (a batched read on Redis).
func (s *Server) treeSizes(ctx context.Context, res *indexer.Result) map[indexer.PodRef]int64 {
	want := false
	for i := range res.Pods {
		if res.Pods[i].MatchedBlocks > 0 {
			want = true
			break
		}
	}
	if !want {
		return nil
	}
	out := map[indexer.PodRef]int64{}
	for _, ps := range s.idx.Pods(ctx, nil) {
		out[indexer.PodRef{Name: ps.Stats.Pod, DPRank: ps.Stats.DPRank}] = ps.Blocks
	}
	return out
}
