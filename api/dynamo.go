package api

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
// GET /dump, its peer registry (dynamo_peers.go), and the Dynamo forms of
// POST /query and /query_by_hash (told
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

// dynReject is a body Dynamo's server refuses before its handler runs:
// axum's Json extractor answers 415 without a JSON Content-Type, 400 for a
// body that is not JSON (syntax, or cut short), 422 for JSON that does not
// fit the request type (a missing field, a wrong type, a number out of
// range), and 413 past its body limit, each with a plain-text message.
// Unknown fields are ignored, as serde ignores them.
type dynReject struct {
	status int
	msg    string
	e      *Error // kvindexd's own refusal (admin scope), written as its JSON error
}

func (d *dynReject) write(w http.ResponseWriter) {
	if d.e != nil {
		writeError(w, d.e)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(d.status)
	_, _ = w.Write([]byte(d.msg))
}

func dataReject(format string, args ...any) *dynReject {
	return &dynReject{status: http.StatusUnprocessableEntity, msg: "Failed to deserialize the JSON body into the target type: " + fmt.Sprintf(format, args...)}
}

// jsonContentType is axum's test: application/json or application/*+json,
// parameters allowed.
func jsonContentType(r *http.Request) bool {
	ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return false
	}
	typ, sub, ok := strings.Cut(ct, "/")
	return ok && typ == "application" && (sub == "json" || strings.HasSuffix(sub, "+json"))
}

// readDynamoBody reads a body up to limit bytes (413 past it, as axum's
// limit).
func readDynamoBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *dynReject) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		if tooBig := new(http.MaxBytesError); errors.As(err, &tooBig) {
			return nil, &dynReject{status: http.StatusRequestEntityTooLarge, msg: "Failed to buffer the request body: length limit exceeded"}
		}
		return nil, &dynReject{status: http.StatusBadRequest, msg: "Failed to buffer the request body: " + err.Error()}
	}
	return buf.Bytes(), nil
}

// decodeDynamoJSON decodes body into v as Dynamo's server would accept it
// (see dynReject): required names the fields that must be present and not
// null, checked by the caller's pointers.
func decodeDynamoJSON(r *http.Request, body []byte, v any) *dynReject {
	if !jsonContentType(r) {
		return &dynReject{status: http.StatusUnsupportedMediaType, msg: "Expected request with `Content-Type: application/json`"}
	}
	if err := json.Unmarshal(body, v); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return &dynReject{status: http.StatusBadRequest, msg: "Failed to parse the request body as JSON: " + err.Error()}
		}
		return dataReject("%v", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// missingField is serde's refusal of an absent required field.
func missingField(name string) *dynReject { return dataReject("missing field `%s`", name) }

// dynRequired is a request body that knows its required fields.
type dynRequired interface{ required() *dynReject }

// decodeDynamoAdmin admits an admin call of Dynamo's: kvindexd's admin
// scope and, for a call that subscribes (/register, /unregister), its
// subscriber first (403, 501), then the body as Dynamo's server decodes it.
func (s *Server) decodeDynamoAdmin(w http.ResponseWriter, r *http.Request, v dynRequired, subscribes bool) *dynReject {
	var e *Error
	switch {
	case !s.adminEnabled():
		e = errAdminOff
	case subscribes && s.cfg.Subscriber == nil:
		e = errorf(codes.Unimplemented, "no event subscriber is running")
	}
	if e != nil {
		return &dynReject{e: e}
	}
	body, rej := readDynamoBody(w, r, maxRegisterBody)
	if rej == nil {
		rej = decodeDynamoJSON(r, body, v)
	}
	if rej == nil {
		rej = v.required()
	}
	return rej
}

type dynRegisterRequest struct {
	InstanceID     *uint64 `json:"instance_id"`
	Endpoint       *string `json:"endpoint"`
	ModelName      *string `json:"model_name"`
	BlockSize      *uint32 `json:"block_size"`
	TenantID       *string `json:"tenant_id"`
	RoutingGroup   *string `json:"routing_group"`
	DPRank         *uint32 `json:"dp_rank"`
	ReplayEndpoint string  `json:"replay_endpoint"`
	// Engine is kvindexd's own addition: the wire format of the endpoint's
	// events (default vllm, which Dynamo's listener decodes).
	Engine string `json:"engine"`
}

// required reports the first required field of a register body that is
// missing, in the order serde reports them (declaration order).
func (q *dynRegisterRequest) required() *dynReject {
	switch {
	case q.InstanceID == nil:
		return missingField("instance_id")
	case q.Endpoint == nil:
		return missingField("endpoint")
	case q.ModelName == nil:
		return missingField("model_name")
	case q.BlockSize == nil:
		return missingField("block_size")
	}
	return nil
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
	var req dynRegisterRequest
	if rej := s.decodeDynamoAdmin(w, r, &req, true); rej != nil {
		s.dynamo.rejected.WithLabelValues("invalid").Inc()
		rej.write(w)
		return
	}
	reason, status, e := s.dynamoRegister(r, &req)
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
func (s *Server) dynamoRegister(r *http.Request, q *dynRegisterRequest) (reason string, status int, e *Error) {
	inst, endpoint, modelName, blockSize := *q.InstanceID, strings.TrimSpace(*q.Endpoint), *q.ModelName, int(*q.BlockSize)
	switch {
	case endpoint == "":
		return "invalid", 0, errorf(codes.InvalidArgument, "endpoint is empty (the engine's ZMQ PUB address, e.g. tcp://10.0.0.7:5557)")
	case modelName == "":
		return "invalid", 0, errorf(codes.InvalidArgument, "model_name is empty")
	case tenant.CheckModel(modelName) != nil:
		return "invalid", 0, errorf(codes.InvalidArgument, "%v", tenant.CheckModel(modelName))
	case blockSize == 0:
		return "invalid", 0, errorf(codes.InvalidArgument, "block_size must be positive (the engine's block size)")
	}
	rank := 0
	if q.DPRank != nil {
		rank = int(*q.DPRank)
	}
	tn, e := tenantOf(q.TenantID, q.RoutingGroup)
	if e != nil {
		return "tenant", 0, e
	}
	tn = orDefault(tn)
	eng, ok := blockkeys.ParseEngine(q.Engine)
	if !ok {
		return "invalid", 0, errorf(codes.InvalidArgument, "engine %q: want vllm, sglang or trtllm", q.Engine)
	}
	if err := s.endpointPolicy().CheckEndpoint(r.Context(), endpoint, q.ReplayEndpoint, ""); err != nil {
		return "policy", http.StatusBadRequest, errorf(codes.InvalidArgument, "%v", err)
	}
	if bs := s.idx.KeyConfig(modelName).BlockSize; bs != blockSize {
		return "block_size", http.StatusConflict, errorf(codes.FailedPrecondition,
			"block_size %d: model %q is indexed in blocks of %d tokens (--block-size, models.NAME.block_size)", blockSize, modelName, bs)
	}
	key := dynKey{tenant: tn, model: modelName, instance: inst, rank: rank}
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
	err := s.cfg.Subscriber.AddEndpoint(kvevents.EndpointConfig{Address: endpoint, Pod: pod, Model: tenant.Model(tn, modelName),
		Engine: eng, ReplayAddress: q.ReplayEndpoint, DPRank: rank, AllTopics: true, Share: true})
	if err != nil {
		return "subscribe", http.StatusConflict, errorf(codes.AlreadyExists, "register instance %d dp_rank %d: %v", inst, rank, err)
	}
	if reg.workers == nil {
		reg.workers = make(map[dynKey]dynWorker)
	}
	reg.workers[key] = dynWorker{address: endpoint, replay: q.ReplayEndpoint, blockSize: blockSize}
	s.idx.EnableDynamoHashes()
	s.log.Info("dynamo worker registered", "instance_id", inst, "dp_rank", rank, "model", modelName, "tenant", tn, "endpoint", endpoint, "engine", eng)
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
	InstanceID   *uint64 `json:"instance_id"`
	ModelName    *string `json:"model_name"`
	TenantID     *string `json:"tenant_id"`
	RoutingGroup *string `json:"routing_group"`
	DPRank       *uint32 `json:"dp_rank"`
}

func (q *dynUnregisterRequest) required() *dynReject {
	switch {
	case q.InstanceID == nil:
		return missingField("instance_id")
	case q.ModelName == nil:
		return missingField("model_name")
	}
	return nil
}

// handleDynamoUnregister removes an instance's registrations for a model:
// every rank, or one (dp_rank); every tenant (tenant_id absent) or the one
// named. Its endpoints are unsubscribed and
// their blocks leave the index (the subscriber clears a removed endpoint's
// streams), as Dynamo removes the worker from its tree. 404 when nothing
// matched, as Dynamo's.
func (s *Server) handleDynamoUnregister(w http.ResponseWriter, r *http.Request) {
	var req dynUnregisterRequest
	if rej := s.decodeDynamoAdmin(w, r, &req, true); rej != nil {
		rej.write(w)
		return
	}
	if e := s.dynamoUnregister(&req); e != nil {
		writeError(w, e)
		return
	}
	dynamoStatus(w, http.StatusOK)
}

func (s *Server) dynamoUnregister(q *dynUnregisterRequest) *Error {
	inst, modelName := *q.InstanceID, *q.ModelName
	tn, e := tenantOf(q.TenantID, q.RoutingGroup)
	if e != nil {
		return e
	}
	reg := &s.dynReg
	reg.mu.Lock()
	defer reg.mu.Unlock()
	s.pruneLocked()
	var gone []dynKey
	for k := range reg.workers {
		if k.model == modelName && k.instance == inst && (q.DPRank == nil || int(*q.DPRank) == k.rank) && (tn == "" || tn == k.tenant) {
			gone = append(gone, k)
		}
	}
	if len(gone) == 0 {
		what := fmt.Sprintf("instance %d", inst)
		if q.DPRank != nil {
			what += fmt.Sprintf(" dp_rank %d", int(*q.DPRank))
		}
		tenants := "any tenant"
		if tn != "" {
			tenants = "tenant=" + tn
		}
		return errorf(codes.NotFound, "%s is not registered for model=%s %s", what, modelName, tenants)
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

// handleDynamoDump answers GET /dump as Dynamo's standalone indexer does:
// {"<model>:<tenant>": {"block_size": N, "events": [RouterEvent, ...]}},
// each model's GPU-tier blocks as one store event per (block, worker),
// parents before children, event ids from 0 (indexer.DynamoDump), which a
// peer applies in order to rebuild its tree. A worker is a pod whose name
// is an unsigned integer (Dynamo's worker ids; a pod named otherwise, e.g.
// by --endpoint, cannot be written as one and is left out). Admin scope, as
// the peer snapshot; one dump streams at a time (503 otherwise).
func (s *Server) handleDynamoDump(w http.ResponseWriter, r *http.Request) {
	if !s.adminEnabled() {
		writeError(w, errAdminOff)
		return
	}
	if !s.dumping.CompareAndSwap(false, true) {
		writeError(w, errorf(codes.Unavailable, "a GET /dump is already streaming; retry when it ends"))
		return
	}
	defer s.dumping.Store(false)
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	_ = bw.WriteByte('{')
	first := true
	var b []byte
	err := s.idx.DynamoDump(r.Context(), func(model string, blockSize int, evs []indexer.DynamoDumpEvent) error {
		tn, m := tenant.Split(model)
		if !first {
			_ = bw.WriteByte(',')
		}
		first = false
		b = appendString(b[:0], m+":"+orDefault(tn))
		b = append(b, `:{"block_size":`...)
		b = strconv.AppendInt(b, int64(blockSize), 10)
		b = append(b, `,"events":[`...)
		id := 0
		for _, e := range evs {
			worker, err := strconv.ParseUint(e.Pod, 10, 64)
			if err != nil {
				continue
			}
			if id > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"worker_id":`...)
			b = strconv.AppendUint(b, worker, 10)
			b = append(b, `,"event":{"event_id":`...)
			b = strconv.AppendInt(b, int64(id), 10)
			b = append(b, `,"data":{"stored":{"parent_hash":`...)
			if e.Root {
				b = append(b, "null"...)
			} else {
				b = strconv.AppendUint(b, e.Parent, 10)
			}
			b = append(b, `,"blocks":[{"block_hash":`...)
			b = strconv.AppendUint(b, e.BlockHash, 10)
			b = append(b, `,"tokens_hash":`...)
			b = strconv.AppendUint(b, e.Local, 10)
			b = append(b, `,"mm_extra_info":null}]}},"dp_rank":`...)
			b = strconv.AppendInt(b, int64(e.DPRank), 10)
			b = append(b, "}}"...)
			id++
			if len(b) > 32<<10 {
				if _, err := bw.Write(b); err != nil {
					return err
				}
				b = b[:0]
			}
		}
		b = append(b, "]}"...)
		_, err := bw.Write(b)
		return err
	})
	if err != nil {
		// The status is sent; a cut-short body is what the peer sees.
		s.log.Warn("GET /dump ended early", "err", err)
		return
	}
	_, _ = bw.WriteString("}\n")
	_ = bw.Flush()
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

type dynQueryRequest struct {
	TokenIDs    *[]uint32 `json:"token_ids"`
	BlockHashes *[]int64  `json:"block_hashes"`
	ModelName   *string   `json:"model_name"`
	TenantID    *string   `json:"tenant_id"`
	// RoutingGroup is Dynamo's later name for tenant_id.
	RoutingGroup *string `json:"routing_group"`
	LoraName     *string `json:"lora_name"`
}

// dynamoQuery answers Dynamo's POST /query (token_ids) and /query_by_hash
// (block_hashes: Dynamo's own LocalBlockHashes, as i64) as its standalone
// indexer does: the body decoded as Dynamo's server decodes it (dynReject),
// 404 for a (model, tenant) with no worker, then the tree walk over
// kvindexd's index (indexer.DynamoScore: device tier only).
func (s *Server) dynamoQuery(w http.ResponseWriter, r *http.Request, body []byte, byHash bool) {
	start := time.Now()
	kind := indexer.InputTokens
	if byHash {
		kind = indexer.InputHashes
	}
	var req dynQueryRequest
	rej := decodeDynamoJSON(r, body, &req)
	if rej == nil {
		switch {
		case byHash && req.BlockHashes == nil:
			rej = missingField("block_hashes")
		case !byHash && req.TokenIDs == nil:
			rej = missingField("token_ids")
		case req.ModelName == nil:
			rej = missingField("model_name")
		}
	}
	if rej != nil {
		s.metrics.observeRequest(indexer.InputNone, codes.InvalidArgument, 0)
		rej.write(w)
		return
	}
	raw := tenant.Default
	if req.TenantID != nil {
		raw = *req.TenantID
	} else if req.RoutingGroup != nil {
		raw = *req.RoutingGroup
	}
	tn, e := tenantOf(req.TenantID, req.RoutingGroup)
	model := tenant.Model(orDefault(tn), *req.ModelName)
	if e != nil || (orDefault(tn) != tenant.Default && tenant.CheckModel(*req.ModelName) != nil) || !s.modelKnown(model) {
		// Dynamo's 404 for a (model, tenant) it has no indexer for; a
		// tenant or model name kvindexd cannot hold has none either.
		e := errorf(codes.NotFound, "no indexer for model=%s tenant=%s", *req.ModelName, raw)
		s.metrics.observeRequest(kind, e.Code, 0)
		writeError(w, e)
		return
	}
	var locals []uint64
	var tokens []uint32
	lora := ""
	if byHash {
		locals = make([]uint64, len(*req.BlockHashes))
		for i, h := range *req.BlockHashes {
			locals[i] = uint64(h) // Dynamo's `h as u64`: the same bits
		}
	} else {
		tokens = *req.TokenIDs
		if req.LoraName != nil {
			lora = *req.LoraName
		}
	}
	var res indexer.DynamoResult
	if err := s.idx.DynamoScore(r.Context(), model, locals, tokens, lora, &res); err != nil {
		e := fromIndexer(err)
		s.metrics.observeRequest(kind, e.Code, time.Since(start))
		writeError(w, e)
		return
	}
	s.metrics.observeRequest(kind, codes.OK, time.Since(start))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(appendDynamoScores(nil, &res, int64(s.idx.KeyConfig(model).BlockSize), s.treeSizes(r.Context(), &res)))
}

// appendDynamoScores writes Dynamo's score answer: scores (matched tokens
// by instance then dp_rank: the nodes of the walked path each rank holds,
// times the block size), frequencies (per walked node, how many ranks hold
// it) and tree_sizes (blocks each scored rank holds).
func appendDynamoScores(b []byte, res *indexer.DynamoResult, blockSize int64, sizes map[indexer.PodRef]int64) []byte {
	b = append(b, `{"scores":`...)
	b = appendByRank(b, res, func(rk indexer.DynamoRank) int64 { return int64(rk.Blocks) * blockSize })
	b = append(b, `,"frequencies":[`...)
	for i, f := range res.Frequencies {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(f), 10)
	}
	b = append(b, `],"tree_sizes":`...)
	b = appendByRank(b, res, func(rk indexer.DynamoRank) int64 {
		return max(sizes[indexer.PodRef{Name: rk.Pod, DPRank: rk.DPRank}], 0)
	})
	return append(b, "}\n"...)
}

// appendByRank writes {"<pod>": {"<dp_rank>": value, ...}, ...}, pods and
// ranks in the order the walk met them.
func appendByRank(b []byte, res *indexer.DynamoResult, value func(indexer.DynamoRank) int64) []byte {
	b = append(b, '{')
	done := make([]bool, len(res.Ranks))
	for i, rk := range res.Ranks {
		if done[i] {
			continue
		}
		if b[len(b)-1] != '{' {
			b = append(b, ',')
		}
		b = appendString(b, rk.Pod)
		b = append(b, ":{"...)
		for j := i; j < len(res.Ranks); j++ {
			if done[j] || res.Ranks[j].Pod != rk.Pod {
				continue
			}
			if j > i {
				b = append(b, ',')
			}
			done[j] = true
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(res.Ranks[j].DPRank), 10)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, value(res.Ranks[j]), 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// treeSizes reads the block count of every scored (pod, rank): one pod
// listing (a batched read on Redis).
func (s *Server) treeSizes(ctx context.Context, res *indexer.DynamoResult) map[indexer.PodRef]int64 {
	if len(res.Ranks) == 0 {
		return nil
	}
	out := map[indexer.PodRef]int64{}
	for _, ps := range s.idx.Pods(ctx, nil) {
		out[indexer.PodRef{Name: ps.Stats.Pod, DPRank: ps.Stats.DPRank}] = ps.Blocks
	}
	return out
}
