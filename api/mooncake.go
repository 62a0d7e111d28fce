package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/tenant"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The Mooncake KV indexer query API (Mooncake's "KV-Store Indexer API"
// proposal, also served by NVIDIA Dynamo's standalone indexer): POST /query
// with token ids and POST /query_by_hash with block hashes, both mapped onto
// indexer.Score so routers written for that API work unchanged.
//
// Mapping (docs/api.md, Mooncake compatibility):
//   - model, lora_name, cache_salt, token_ids: as in /v1/score;
//   - seq_hashes (or the older name block_hash): /v1/score's block_hashes,
//     i.e. the hashes the engines publish;
//   - instance_id: restricts the answer to that pod (/v1/score's pods);
//   - lora_name and cache_salt with hashes: accepted and ignored (the
//     engine mixed them into the hashes already);
//   - block_size: optional; when given it must equal the model's configured
//     block size, since the index holds blocks of that size only;
//   - tenant_id: selects the tenant's namespace of models
//     (internal/tenant; the one Dynamo's POST /register with that tenant_id
//     fills) and names the answer's top-level key (default "default"): a
//     query for one tenant never counts another tenant's blocks.
//
// The answer is {tenant: {pod: {"longest_matched": T, "GPU": T, "CPU": T,
// "DISK": T, "EXTERNAL": T, "DP": {"rank": T}}}} in tokens: longest_matched
// is the pod's best DP rank's run of consecutive blocks from block 0 times
// the block size, each medium the tokens of that run held on it, and DP
// each rank's own run. Pods holding not even the first block are left out.

// mooncakeMedia are the answer's medium keys by stored tier. Mooncake's
// answer has no key for blocks a pod loads from a storage source
// (event.TierShared): they are storage outside the pod, so they are added
// to EXTERNAL.
var mooncakeMedia = [event.NumStoredTiers]string{"GPU", "CPU", "DISK", "EXTERNAL"}

type mooncakeRequest struct {
	Model string `json:"model"`
	// ModelName is Dynamo's name for model; a body naming it gets Dynamo's
	// answer (dynamo.go), a body naming model Mooncake's.
	ModelName string        `json:"model_name"`
	LoraName  string        `json:"lora_name"`
	LoraID    *int64        `json:"lora_id"`
	TokenIDs  []uint32      `json:"token_ids"`
	SeqHashes []json.Number `json:"seq_hashes"`
	BlockHash []json.Number `json:"block_hash"`
	// BlockHashes is Dynamo's name for seq_hashes.
	BlockHashes  []json.Number `json:"block_hashes"`
	RoutingGroup *string       `json:"routing_group"`
	TenantID     string        `json:"tenant_id"`
	InstanceID   string        `json:"instance_id"`
	BlockSize    int           `json:"block_size"`
	CacheSalt    string        `json:"cache_salt"`
}

func (s *Server) handleMooncakeQuery(w http.ResponseWriter, r *http.Request) {
	s.mooncake(w, r, false)
}

func (s *Server) handleMooncakeQueryByHash(w http.ResponseWriter, r *http.Request) {
	s.mooncake(w, r, true)
}

func (s *Server) mooncake(w http.ResponseWriter, r *http.Request, byHash bool) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
		e := errorf(codes.InvalidArgument, "read body: %v", err)
		if tooBig := new(http.MaxBytesError); errors.As(err, &tooBig) {
			e = &Error{Code: codes.ResourceExhausted, Msg: "read body: " + err.Error(), Status: http.StatusRequestEntityTooLarge}
		}
		s.metrics.observeRequest(indexer.InputNone, e.Code, 0)
		writeError(w, e)
		return
	}
	if dynamoForm(buf.Bytes()) {
		s.dynamoQuery(w, r, buf.Bytes(), byHash)
		return
	}
	req, q, e := parseMooncake(buf.Bytes(), byHash)
	if e != nil {
		s.metrics.observeRequest(indexer.InputNone, e.Code, 0)
		writeError(w, e)
		return
	}
	if req.BlockSize != 0 {
		if bs := s.idx.KeyConfig(req.Model).BlockSize; bs != req.BlockSize {
			e := errorf(codes.InvalidArgument, "block_size %d: model %q is indexed in blocks of %d tokens (--block-size, models.NAME.block_size)",
				req.BlockSize, req.Model, bs)
			s.metrics.observeRequest(q.Kind, e.Code, 0)
			writeError(w, e)
			return
		}
	}
	res, e := s.score(r.Context(), &q)
	if e != nil {
		writeError(w, e)
		return
	}
	defer putResult(res)
	b := append([]byte(`{`), appendString(nil, req.TenantID)...)
	b = append(b, ":{"...)
	bs := int64(res.BlockSize)
	for i := range res.Pods {
		p := &res.Pods[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, p.Pod)
		b = append(b, `:{"longest_matched":`...)
		b = strconv.AppendInt(b, int64(p.MatchedBlocks)*bs, 10)
		for t, name := range mooncakeMedia {
			b = append(b, `,"`...)
			b = append(b, name...)
			b = append(b, `":`...)
			n := int64(p.Tiers[t])
			if event.Tier(t) == event.TierExternal {
				n += int64(p.Tiers[event.TierShared])
			}
			b = strconv.AppendInt(b, n*bs, 10)
		}
		b = append(b, `,"DP":{`...)
		for j := range p.Ranks {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = strconv.AppendInt(b, int64(p.Ranks[j].DPRank), 10)
			b = append(b, `":`...)
			b = strconv.AppendInt(b, int64(p.Ranks[j].MatchedBlocks)*bs, 10)
		}
		b = append(b, "}}"...)
	}
	b = append(b, "}}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// dynamoForm tells Dynamo's form of the two calls from Mooncake's: it names
// model_name and not model. A body that is not JSON is Dynamo's when it
// spells "model_name" and not "model" (400 either way; the message is
// Dynamo's then).
func dynamoForm(body []byte) bool {
	var probe struct {
		Model     json.RawMessage `json:"model"`
		ModelName json.RawMessage `json:"model_name"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return bytes.Contains(body, []byte(`"model_name"`)) && !bytes.Contains(body, []byte(`"model"`))
	}
	return probe.ModelName != nil && probe.Model == nil
}

func parseMooncake(body []byte, byHash bool) (mooncakeRequest, indexer.Query, *Error) {
	var req mooncakeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "invalid JSON body: %v", err)
	}
	switch {
	case req.ModelName != "":
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "give model (Mooncake) or model_name (Dynamo), not both")
	case req.Model == "":
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "model is required (Mooncake's model, or Dynamo's model_name)")
	case req.RoutingGroup != nil:
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "routing_group is Dynamo's field: send it with model_name")
	}
	var tid *string
	if req.TenantID != "" {
		tid = &req.TenantID
	}
	tn, e := tenantOf(tid, req.RoutingGroup)
	if e != nil {
		return req, indexer.Query{}, e
	}
	req.TenantID = orDefault(tn)
	if req.TenantID != tenant.Default {
		if err := tenant.CheckModel(req.Model); err != nil {
			return req, indexer.Query{}, errorf(codes.InvalidArgument, "%v", err)
		}
	}
	if req.LoraID != nil {
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "lora_id is not supported: send lora_name (the adapter name the engine hashes)")
	}
	if req.BlockSize < 0 {
		return req, indexer.Query{}, errorf(codes.InvalidArgument, "block_size %d is negative", req.BlockSize)
	}
	q := indexer.Query{Model: tenant.Model(req.TenantID, req.Model), LoraName: req.LoraName, CacheSalt: req.CacheSalt}
	if req.InstanceID != "" {
		q.Pods = []string{req.InstanceID}
	}
	if !byHash {
		if req.SeqHashes != nil || req.BlockHash != nil || req.BlockHashes != nil {
			return req, q, errorf(codes.InvalidArgument, "/query takes token_ids; send hashes to /query_by_hash")
		}
		q.Kind, q.TokenIDs = indexer.InputTokens, req.TokenIDs
		return req, q, nil
	}
	if req.TokenIDs != nil {
		return req, q, errorf(codes.InvalidArgument, "/query_by_hash takes seq_hashes; send token ids to /query")
	}
	var hashes []json.Number
	n := 0
	for _, h := range [][]json.Number{req.SeqHashes, req.BlockHash, req.BlockHashes} {
		if h != nil {
			hashes = h
			n++
		}
	}
	if n > 1 {
		return req, q, errorf(codes.InvalidArgument, "give one of seq_hashes, block_hash (Mooncake) or block_hashes (Dynamo), not both")
	}
	q.Kind, q.BlockHashes = indexer.InputHashes, make([]uint64, len(hashes))
	for i, h := range hashes {
		v, err := parseHash(h.String())
		if err != nil {
			return req, q, errorf(codes.InvalidArgument, "seq_hashes[%d]: %v", i, err)
		}
		q.BlockHashes[i] = v
	}
	// The engine mixed the adapter and salt into the hashes already; RFC
	// clients send them along anyway, so they are accepted and not reused.
	q.LoraName, q.CacheSalt = "", ""
	return req, q, nil
}
