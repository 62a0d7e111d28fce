// Package client is what a router imports to ask kvindexd where to send a
// request: one gRPC connection reused by every call, a deadline per call,
// and a documented answer when the daemon cannot be reached.
//
// Fallback: when the daemon is unreachable, too slow (the per-call
// deadline passed), unavailable (its index is down) or failing, Pick does
// not fail: it returns the least loaded candidate (fewest running +
// waiting requests, then lowest KV usage, then the earliest; the daemon's
// own least-loaded policy, run locally; with P/D roles, among the
// candidates that decode, and with no prefill pod) with Decision.Fallback
// set and the cause in Decision.Err. A router therefore always gets a pod while the
// daemon restarts. Requests the daemon rejects as malformed
// (InvalidArgument, FailedPrecondition) are errors: routing them anywhere
// would hide a bug.
package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/internal/grpcbuf"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// DefaultTimeout bounds one Pick when Config.Timeout is 0: a routing
// decision that takes longer costs more than the cache hit it might win.
const DefaultTimeout = 50 * time.Millisecond

// Config configures a Client.
type Config struct {
	// Addr is the daemon's gRPC address: host:port, unix:///path for a
	// daemon listening on a unix socket (--grpc-addr unix:///path), or any
	// gRPC target.
	Addr string
	// Timeout is the deadline of one call (0 = DefaultTimeout); a caller's
	// earlier context deadline wins.
	Timeout time.Duration
	// DialOptions replace the default (plaintext) transport options.
	DialOptions []grpc.DialOption
}

// Client talks to one daemon over one multiplexed connection. It is safe
// for concurrent use; create one per process and Close it at exit.
type Client struct {
	conn    *grpc.ClientConn
	c       kvindexv1.IndexerClient
	timeout time.Duration
}

// New creates the client. It does not dial: the connection is made on the
// first call and re-established by gRPC when it drops.
func New(cfg Config) (*Client, error) {
	if cfg.Addr == "" {
		return nil, errors.New("client: Addr is required")
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("client: Timeout must not be negative")
	}
	opts := cfg.DialOptions
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// Finer buffer tiers than grpc-go's, in the transport and the codec
	// (internal/grpcbuf): an 8k-token request would otherwise zero a 1 MiB
	// buffer per call.
	opts = append([]grpc.DialOption{experimental.WithBufferPool(grpcbuf.Pool),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(grpcbuf.Codec))}, opts...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	t := cfg.Timeout
	if t == 0 {
		t = DefaultTimeout
	}
	return &Client{conn: conn, c: kvindexv1.NewIndexerClient(conn), timeout: t}, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Candidate is one endpoint the router may choose, with its load.
type Candidate struct {
	Pod string
	// DPRank names one data-parallel rank; nil = any rank of the pod.
	DPRank  *int
	Waiting int
	Running int
	// KVUsage is the share of the engine's KV cache in use, 0..1.
	KVUsage float64
	// Events says whether the pod publishes KV events; nil = the daemon
	// decides (yes if it has seen the pod's events).
	Events *bool
	// Role is the pod's part in a disaggregated fleet: "prefill",
	// "decode", "both" (also "prefill-decode"), "encode"; "" = both. With
	// any role other than both, Decision.Pod is the decode pod and
	// Decision may name a PrefillPod and a KVSource (docs/api.md, "P/D").
	Role string
}

// Request is one routing question: the request's model and exactly one of
// TokenIDs, BlockHashes or Prompt, and the candidates.
type Request struct {
	Model       string
	TokenIDs    []uint32
	BlockHashes []uint64
	Prompt      string
	LoraName    string
	CacheSalt   string
	Candidates  []Candidate
	// Policy names the daemon's policy; "" = its default.
	Policy string
	// AddSpecialTokens is the request's add_special_tokens for a Prompt
	// (the daemon refuses it with TokenIDs or BlockHashes); nil = vLLM's
	// default (true).
	AddSpecialTokens *bool
}

// CandidateResult is the daemon's view of one candidate.
type CandidateResult struct {
	Pod               string
	MatchedBlocks     int
	SpeculativeBlocks int
	Approximate       bool
	Score             float64
	Cost              float64
	// Role is the candidate's role in a P/D answer ("" otherwise).
	Role string
}

// PrefillPod is the pod that prefills a P/D request for Decision.Pod.
type PrefillPod struct {
	// Index is its position in Request.Candidates.
	Index         int
	Pod           string
	DPRank        *int
	Reason        string
	MatchedBlocks int
}

// Disaggregation is a P/D pick's decision and the numbers it read:
// Decision is "disaggregated", "few-uncached-tokens", "prefill-pool-busy"
// or "no-prefill-pool".
type Disaggregation struct {
	Decision              string
	NonCachedTokens       int
	PrefillWaiting        int
	MaxLocalPrefillTokens int
	MaxPrefillWaiting     int
}

// KVSource is a pod holding more leading blocks of the request than the
// chosen pods: a connector that can pull (NIXL, LMCache P2P, Mooncake)
// loads ExtraBlocks from it instead of recomputing them.
type KVSource struct {
	Pod    string
	DPRank *int
	// Index is its position in Request.Candidates, -1 for a pod the router
	// did not offer.
	Index       int
	Blocks      int
	ExtraBlocks int
}

// Decision is where to send the request.
type Decision struct {
	// Index is the chosen candidate's position in Request.Candidates.
	Index int
	Pod   string
	// DPRank is the rank to address when the daemon named one.
	DPRank *int
	Policy string
	Reason string
	// PickID names the decision for Feedback ("" on fallback).
	PickID string
	// Candidates are the daemon's numbers, in request order (nil on
	// fallback).
	Candidates []CandidateResult
	// P/D answers only (some candidate had a role other than both):
	// Disaggregation always, PrefillPod when it disaggregates, KVSource
	// when a pod holds more than the chosen ones.
	Disaggregation *Disaggregation
	PrefillPod     *PrefillPod
	KVSource       *KVSource
	// Fallback is set when the daemon could not answer and the least
	// loaded candidate was chosen locally; Err is why.
	Fallback bool
	Err      error
}

// Pick asks the daemon; see the package comment for the fallback. It
// returns an error only for a request that cannot be routed at all (no
// candidates) or that the daemon rejects as malformed.
func (c *Client) Pick(ctx context.Context, r *Request) (*Decision, error) {
	if len(r.Candidates) == 0 {
		return nil, errors.New("client: no candidates")
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.c.Pick(ctx, toProto(r))
	if err != nil {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.Unimplemented:
			return nil, fmt.Errorf("client: pick: %w", err)
		}
		return Fallback(r, err), nil
	}
	d := &Decision{Index: -1, Pod: resp.GetPod(), Policy: resp.GetPolicy(), Reason: resp.GetReason(), PickID: resp.GetPickId(),
		Candidates: make([]CandidateResult, len(resp.GetCandidates()))}
	if resp.DpRank != nil {
		v := int(resp.GetDpRank())
		d.DPRank = &v
	}
	for i, pc := range resp.GetCandidates() {
		d.Candidates[i] = CandidateResult{Pod: pc.GetPod(), MatchedBlocks: int(pc.GetMatchedBlocks()),
			SpeculativeBlocks: int(pc.GetSpeculativeBlocks()), Approximate: pc.GetApproximate(), Score: pc.GetScore(), Cost: pc.GetCost(),
			Role: pc.GetRole()}
	}
	readPD(d, resp)
	for i := range r.Candidates {
		if r.Candidates[i].Pod == d.Pod && (r.Candidates[i].DPRank == nil || d.DPRank == nil || *r.Candidates[i].DPRank == *d.DPRank) {
			d.Index = i
			break
		}
	}
	if d.Index < 0 {
		return Fallback(r, fmt.Errorf("client: daemon picked %q, not a candidate", d.Pod)), nil
	}
	return d, nil
}

// readPD copies a P/D answer's fields into d.
func readPD(d *Decision, resp *kvindexv1.PickResponse) {
	if x := resp.GetDisaggregation(); x != nil {
		d.Disaggregation = &Disaggregation{Decision: x.GetDecision(), NonCachedTokens: int(x.GetNonCachedTokens()),
			PrefillWaiting: int(x.GetPrefillWaiting()), MaxLocalPrefillTokens: int(x.GetMaxLocalPrefillTokens()),
			MaxPrefillWaiting: int(x.GetMaxPrefillWaiting())}
	}
	if p := resp.GetPrefillPod(); p != nil {
		d.PrefillPod = &PrefillPod{Index: int(p.GetCandidate()), Pod: p.GetPod(), Reason: p.GetReason(),
			MatchedBlocks: int(p.GetMatchedBlocks())}
		if p.DpRank != nil {
			v := int(p.GetDpRank())
			d.PrefillPod.DPRank = &v
		}
	}
	if k := resp.GetKvSource(); k != nil {
		d.KVSource = &KVSource{Pod: k.GetPod(), Index: -1, Blocks: int(k.GetBlocks()), ExtraBlocks: int(k.GetExtraBlocks())}
		if k.DpRank != nil {
			v := int(k.GetDpRank())
			d.KVSource.DPRank = &v
		}
		if k.Candidate != nil {
			d.KVSource.Index = int(k.GetCandidate())
		}
	}
}

// Fallback is the decision Pick returns without the daemon: the least
// loaded candidate by routing.LeastLoaded, with cause as Err; with P/D
// roles, the least loaded of the candidates that decode (no prefill pod:
// the decode pod prefills itself). r must have at least one candidate.
func Fallback(r *Request, cause error) *Decision {
	decodes := func(c *Candidate) bool {
		role, ok := routing.ParseRole(c.Role)
		return !ok || role.Decodes() // an unknown role is the daemon's to reject
	}
	best := -1
	for i := range r.Candidates {
		c := &r.Candidates[i]
		if decodes(c) && (best < 0 || lessLoaded(c, &r.Candidates[best])) {
			best = i
		}
	}
	if best < 0 { // nobody decodes: the least loaded of all
		best = 0
		for i := range r.Candidates {
			if lessLoaded(&r.Candidates[i], &r.Candidates[best]) {
				best = i
			}
		}
	}
	c := &r.Candidates[best]
	return &Decision{Index: best, Pod: c.Pod, DPRank: c.DPRank, Policy: routing.NameLeastLoaded,
		Reason: "daemon-unreachable", Fallback: true, Err: cause}
}

// lessLoaded is routing.LeastLoaded's order on the client's candidates.
func lessLoaded(a, b *Candidate) bool {
	la := routing.Load{Waiting: a.Waiting, Running: a.Running, KVUsage: a.KVUsage}
	lb := routing.Load{Waiting: b.Waiting, Running: b.Running, KVUsage: b.KVUsage}
	if x, y := la.InFlight(), lb.InFlight(); x != y {
		return x < y
	}
	return la.KVUsage < lb.KVUsage
}

func toProto(r *Request) *kvindexv1.PickRequest {
	req := &kvindexv1.PickRequest{Model: r.Model, LoraName: r.LoraName, CacheSalt: r.CacheSalt, Policy: r.Policy,
		AddSpecialTokens: r.AddSpecialTokens, Candidates: make([]*kvindexv1.Candidate, len(r.Candidates))}
	switch {
	case len(r.TokenIDs) > 0:
		// Packed: copied rather than varint-coded on both sides (the field's
		// comment in the proto; docs/performance.md). It aliases r.TokenIDs
		// until the call returns.
		req.Input = &kvindexv1.PickRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: kvindexv1.PackTokenIDs(r.TokenIDs)}}
	case len(r.BlockHashes) > 0:
		req.Input = &kvindexv1.PickRequest_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: r.BlockHashes}}
	case r.Prompt != "":
		req.Input = &kvindexv1.PickRequest_Prompt{Prompt: r.Prompt}
	}
	cands := make([]kvindexv1.Candidate, len(r.Candidates))
	for i := range r.Candidates {
		c, pc := &r.Candidates[i], &cands[i]
		pc.Pod, pc.Waiting, pc.Running, pc.KvUsage, pc.Events, pc.Role = c.Pod, int32(c.Waiting), int32(c.Running), c.KVUsage, c.Events, c.Role
		if c.DPRank != nil {
			v := int32(*c.DPRank)
			pc.DpRank = &v
		}
		req.Candidates[i] = pc
	}
	return req
}
