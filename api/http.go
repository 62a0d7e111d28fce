package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/tokenization/chattemplate"
)

// maxBodyBytes bounds a request body (a 1M-token request is ~8 MB of JSON).
const maxBodyBytes = 64 << 20

// Handler returns the HTTP/JSON surface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.handleStatusPage)
	mux.HandleFunc("GET /v1/status", s.handleStatus)
	mux.HandleFunc("POST /v1/score", s.handleScore)
	mux.HandleFunc("POST /v1/pick", s.handlePick)
	mux.HandleFunc("POST /v1/feedback", s.handleFeedback)
	mux.HandleFunc("POST /query", s.handleMooncakeQuery)
	mux.HandleFunc("POST /query_by_hash", s.handleMooncakeQueryByHash)
	mux.HandleFunc("POST /register", s.handleDynamoRegister)
	mux.HandleFunc("POST /unregister", s.handleDynamoUnregister)
	mux.HandleFunc("GET /workers", s.handleDynamoWorkers)
	mux.HandleFunc("GET /dump", s.handleDynamoDump)
	mux.HandleFunc("POST /register_peer", s.handleDynamoRegisterPeer)
	mux.HandleFunc("POST /deregister_peer", s.handleDynamoDeregisterPeer)
	mux.HandleFunc("GET /peers", s.handleDynamoPeers)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		// Dynamo's liveness probe: 200 with no body, whatever the state.
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /v1/pods", s.handlePods)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /v1/endpoints", s.handleListEndpoints)
	mux.HandleFunc("POST /v1/endpoints", s.handleAddEndpoint)
	mux.HandleFunc("DELETE /v1/endpoints", s.handleRemoveEndpoint)
	mux.HandleFunc("GET "+indexer.PeerSnapshotPath, s.handlePeerSnapshot)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ok, why := s.Ready(); !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: "+why+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return s.guard(jsonMuxErrors(mux))
}

// httpStatus maps a gRPC code to the HTTP status of the same meaning.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.FailedPrecondition:
		return http.StatusUnprocessableEntity
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusRequestEntityTooLarge
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // client closed request (nginx convention)
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, e *Error) {
	status := e.Status
	if status == 0 {
		status = httpStatus(e.Code)
	}
	writeErrorStatus(w, status, e)
}

// writeJSON sets the headers before the status: after WriteHeader they
// would be dropped.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// httpScratch holds the per-request buffers of the HTTP score path.
type httpScratch struct {
	body scoreBody
	out  []byte
	buf  bytes.Buffer
}

var httpPool = sync.Pool{New: func() any { return new(httpScratch) }}

func (s *Server) handleScore(w http.ResponseWriter, r *http.Request) {
	sc := httpPool.Get().(*httpScratch)
	defer func() {
		// Keep pooled buffers bounded: one huge request must not pin memory.
		if sc.buf.Cap() <= 4<<20 && cap(sc.out) <= 1<<20 && cap(sc.body.tokens) <= 1<<20 {
			httpPool.Put(sc)
		}
	}()
	ctx, span := s.startHTTP(r, spanHTTPScore, routeScore)
	start := time.Now()
	q, perr := sc.parse(w, r)
	if perr != nil {
		s.metrics.observeRequest(indexer.InputNone, perr.Code, 0)
		endRequest(span, false, nil, perr)
		writeError(w, perr)
		return
	}
	s.stage(indexer.OpScore, indexer.StageParse, start)
	a, err := s.score(ctx, &q)
	endRequest(span, false, &q, err)
	if err != nil {
		writeError(w, err)
		return
	}
	start = time.Now()
	sc.out = appendScoreJSON(sc.out[:0], a)
	putResult(a)
	s.stage(indexer.OpScore, indexer.StageEncode, start)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(sc.out)))
	_, _ = w.Write(sc.out)
}

func (sc *httpScratch) parse(w http.ResponseWriter, r *http.Request) (indexer.Query, *Error) {
	sc.buf.Reset()
	if _, err := sc.buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes)); err != nil {
		if tooBig := new(http.MaxBytesError); errors.As(err, &tooBig) {
			return indexer.Query{}, errorf(codes.ResourceExhausted, "read body: %v", err)
		}
		return indexer.Query{}, errorf(codes.InvalidArgument, "read body: %v", err)
	}
	b := &sc.body
	if err := parseScoreBody(sc.buf.Bytes(), b); err != nil {
		return indexer.Query{}, errorf(codes.InvalidArgument, "%v", err)
	}
	var q indexer.Query
	return q, b.query(&q)
}

// query sets q's input from a decoded score (or pick) body: exactly one of
// token_ids, block_hashes, prompt, messages or request.
func (b *scoreBody) query(q *indexer.Query) *Error {
	q.Model, q.LoraName, q.CacheSalt, q.Pods, q.SessionID = b.model, b.loraName, b.cacheSalt, b.pods, b.sessionID
	n := 0
	if b.hasTokens {
		n++
		q.Kind, q.TokenIDs = indexer.InputTokens, b.tokens
	}
	if b.hasHashes {
		n++
		q.Kind, q.BlockHashes = indexer.InputHashes, b.hashes
	}
	if b.hasPrompt {
		n++
		q.Kind, q.Prompt = indexer.InputPrompt, b.prompt
	}
	if b.messages != nil {
		n++
		q.Kind = indexer.InputMessages
		q.Chat = &chattemplate.Request{Messages: b.messages, Tools: b.tools, Documents: b.documents,
			AddGenerationPrompt: b.addGen.ptr(), ContinueFinalMessage: b.cont.v, ChatTemplateKwargs: b.kwargs}
		if b.effort != nil && string(b.effort) != "null" {
			var e string
			if err := json.Unmarshal(b.effort, &e); err != nil {
				return errorf(codes.InvalidArgument, "reasoning_effort must be a string")
			}
			q.Chat.ReasoningEffort = &e
		}
	} else if b.tools != nil || b.documents != nil || b.kwargs != nil || b.effort != nil || b.addGen.set || b.cont.set {
		return errorf(codes.InvalidArgument, "tools, documents, add_generation_prompt, continue_final_message, chat_template_kwargs and reasoning_effort apply to messages only")
	}
	q.AddSpecialTokens = b.addSpecial.ptr()
	if b.request != nil {
		if n > 0 || q.AddSpecialTokens != nil {
			return errorf(codes.InvalidArgument, "request carries the whole OpenAI body: give no other input field beside it")
		}
		if err := q.SetOpenAIRequest(b.request); err != nil {
			return fromIndexer(err)
		}
		return nil
	}
	if n > 1 {
		return errorf(codes.InvalidArgument, "give exactly one of token_ids, block_hashes, prompt, messages or request")
	}
	return nil
}

// parseHash accepts a block hash as vLLM publishes it (uint64) or as a
// signed int64 (SGLang, Python hash()), which is taken as its two's complement.
func parseHash(s string) (uint64, error) {
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return uint64(i), nil
	}
	return 0, fmt.Errorf("%s is not a 64-bit integer", s)
}

// appendScoreJSON writes the score answer without reflection: this is the
// hot path and its shape is fixed.
func appendScoreJSON(b []byte, a *indexer.Result) []byte {
	b = append(b, `{"total_blocks":`...)
	b = strconv.AppendInt(b, int64(a.TotalBlocks), 10)
	if a.IndexRebuilding > 0 {
		b = append(b, `,"index_rebuilding_pods":`...)
		b = strconv.AppendInt(b, int64(a.IndexRebuilding), 10)
	}
	if a.UnscoredReason != "" {
		// Only a prompt cut short says so: other answers keep their shape.
		b = append(b, `,"unscored_reason":`...)
		b = appendString(b, a.UnscoredReason)
	}
	b = append(b, `,"pods":[`...)
	for i := range a.Pods {
		p := &a.Pods[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"pod":`...)
		b = appendString(b, p.Pod)
		b = append(b, `,"matched_blocks":`...)
		b = strconv.AppendInt(b, int64(p.MatchedBlocks), 10)
		b = append(b, `,"matched_tokens":`...)
		b = strconv.AppendInt(b, p.MatchedTokens, 10)
		b = append(b, `,"score":`...)
		b = appendFloat(b, p.Score)
		b = append(b, `,"tiers":`...)
		b = appendTiers(b, &p.Tiers)
		b = append(b, `,"tier_runs":`...)
		b = appendTiers(b, &p.TierRuns)
		if p.Session {
			// only answers to a query naming a session say so
			b = append(b, `,"session":true`...)
		}
		b = append(b, `,"apply_lag_seconds":`...)
		b = appendFloat(b, p.ApplyLag.Seconds())
		if p.Complete {
			b = append(b, `,"complete":true`...)
		} else {
			b = append(b, `,"complete":false,"incomplete_reason":`...)
			b = appendString(b, p.IncompleteReason)
		}
		b = append(b, `,"dp_ranks":[`...)
		for j := range p.Ranks {
			r := &p.Ranks[j]
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"dp_rank":`...)
			b = strconv.AppendInt(b, int64(r.DPRank), 10)
			b = append(b, `,"matched_blocks":`...)
			b = strconv.AppendInt(b, int64(r.MatchedBlocks), 10)
			b = append(b, `,"score":`...)
			b = appendFloat(b, r.Score)
			b = append(b, `,"tiers":`...)
			b = appendTiers(b, &r.Tiers)
			b = append(b, `,"tier_runs":`...)
			b = appendTiers(b, &r.TierRuns)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}\n"...)
}

func appendTiers(b []byte, t *indexer.TierCounts) []byte {
	b = append(b, '{')
	for i := event.Tier(0); i < event.NumTiers; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, i.String()...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, int64(t[i]), 10)
	}
	return append(b, '}')
}

func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// appendString quotes s as a JSON string; pod names are usually plain ASCII
// so the common case is a copy.
func appendString(b []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	q, _ := json.Marshal(s)
	return append(b, q...)
}

func (s *Server) handlePods(w http.ResponseWriter, r *http.Request) {
	pods, storage := s.splitStorage(s.listPods(r.Context()))
	writeJSON(w, http.StatusOK, struct {
		Pods    []PodInfo `json:"pods"`
		Storage []PodInfo `json:"storage,omitempty"`
	}{pods, storage})
}

func (s *Server) handleListEndpoints(w http.ResponseWriter, _ *http.Request) {
	eps, err := s.listEndpoints()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Endpoints []EndpointInfo `json:"endpoints"`
	}{eps})
}

func (s *Server) handleAddEndpoint(w http.ResponseWriter, r *http.Request) {
	var ep EndpointInfo
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ep); err != nil {
		writeError(w, errorf(codes.InvalidArgument, "invalid JSON body: %v", err))
		return
	}
	if err := s.addEndpoint(&ep); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, ep)
}

// handleRemoveEndpoint takes the address from ?address= or a JSON body
// {"address": ...}.
func (s *Server) handleRemoveEndpoint(w http.ResponseWriter, r *http.Request) {
	addr := r.URL.Query().Get("address")
	if addr == "" {
		var body struct {
			Address string `json:"address"`
		}
		err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body)
		if err != nil && !errors.Is(err, io.EOF) {
			writeError(w, errorf(codes.InvalidArgument, "invalid JSON body: %v", err))
			return
		}
		addr = strings.TrimSpace(body.Address)
	}
	if err := s.removeEndpoint(addr); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
