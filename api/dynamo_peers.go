package api

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Dynamo's peer registry (POST /register_peer, POST /deregister_peer,
// GET /peers): the URLs of the indexers a restarted one may recover from.
// In Dynamo's standalone indexer (server.rs, registry.rs at bc2583516003)
// it is a set of strings seeded with its --peers after its startup
// recovery; registering or removing a peer changes the listing and nothing
// else, since recovery runs only at startup. kvindexd's is the same, seeded
// with --peers (its own recovery, also at startup only, reads --peers), and
// bounded: at most maxPeers URLs of at most maxPeerURL bytes
// (kvindexd_dynamo_peers). The three routes need the admin scope, as
// /register.

const (
	maxPeers   = 256
	maxPeerURL = 2048
)

type dynPeers struct {
	mu    sync.Mutex
	urls  []string // in registration order
	gauge prometheus.GaugeFunc
}

func newDynPeers(reg *prometheus.Registry, seed []string) (*dynPeers, error) {
	p := &dynPeers{}
	for _, u := range seed {
		if !slices.Contains(p.urls, u) && len(p.urls) < maxPeers {
			p.urls = append(p.urls, u)
		}
	}
	p.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvindexd_dynamo_peers",
		Help: "Peer URLs in Dynamo's peer registry (--peers, POST /register_peer); at most 256.",
	}, func() float64 { p.mu.Lock(); defer p.mu.Unlock(); return float64(len(p.urls)) })
	return p, reg.Register(p.gauge)
}

type dynPeerRequest struct {
	URL *string `json:"url"`
}

func (q *dynPeerRequest) required() *dynReject {
	if q.URL == nil {
		return missingField("url")
	}
	return nil
}

// handleDynamoRegisterPeer adds a URL (201 {"status":"ok"}, also when it
// was listed already, as Dynamo's). kvindexd's bound: a URL past 2048
// bytes is 400, a 257th peer 409.
func (s *Server) handleDynamoRegisterPeer(w http.ResponseWriter, r *http.Request) {
	var req dynPeerRequest
	if rej := s.decodeDynamoAdmin(w, r, &req, false); rej != nil {
		rej.write(w)
		return
	}
	u := *req.URL
	if len(u) > maxPeerURL {
		writeError(w, errorf(codes.InvalidArgument, "url is %d bytes, more than %d", len(u), maxPeerURL))
		return
	}
	p := s.dynPeers
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.urls, u) {
		if len(p.urls) >= maxPeers {
			writeErrorStatus(w, http.StatusConflict, errorf(codes.ResourceExhausted, "%d peers are registered, the limit: POST /deregister_peer some first", len(p.urls)))
			return
		}
		p.urls = append(p.urls, u)
	}
	dynamoStatus(w, http.StatusCreated)
}

// handleDynamoDeregisterPeer removes a URL: 200 {"status":"ok"}, or 404
// {"error":"peer not found"}.
func (s *Server) handleDynamoDeregisterPeer(w http.ResponseWriter, r *http.Request) {
	var req dynPeerRequest
	if rej := s.decodeDynamoAdmin(w, r, &req, false); rej != nil {
		rej.write(w)
		return
	}
	p := s.dynPeers
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.urls, *req.URL)
	if i < 0 {
		writeError(w, errorf(codes.NotFound, "peer not found"))
		return
	}
	p.urls = slices.Delete(p.urls, i, i+1)
	dynamoStatus(w, http.StatusOK)
}

// handleDynamoPeers lists the registered URLs as a JSON array of strings.
func (s *Server) handleDynamoPeers(w http.ResponseWriter, _ *http.Request) {
	if !s.adminEnabled() {
		writeError(w, errAdminOff)
		return
	}
	p := s.dynPeers
	p.mu.Lock()
	urls := slices.Clone(p.urls)
	p.mu.Unlock()
	if urls == nil {
		urls = []string{}
	}
	b, _ := json.Marshal(urls) // compact, as Dynamo's
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
