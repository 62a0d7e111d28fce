package routing

import (
	"errors"
	"fmt"
)

// Disaggregated prefill/decode (P/D) routing.
//
// A P/D fleet runs the prompt's prefill on one pod and the decoding on
// another, the KV blocks moving from the first to the second through a KV
// connector (vLLM's NIXL, P2P NCCL or LMCache connectors, Mooncake). A
// router then chooses a pair, in the order llm-d's router does it
// (llm-d-router docs/disaggregation.md; the inference scheduler's
// pd-profile-handler): the decode pod first, with the same scorers as an
// aggregated fleet, so a multi-turn conversation returns to the pod that
// holds its history; then the decision whether a remote prefill pays at all;
// then the prefill pod, again by its own cached prefix and load. The
// functions below are that sequence, pure: the caller fills the candidates'
// Matched, Cached and Load, and gets indexes back.

// Role is what a pod does in a P/D fleet. The zero value, RoleBoth, is an
// aggregated pod: a fleet without roles routes exactly as before.
type Role uint8

const (
	// RoleBoth prefills and decodes (llm-d "both"; also a pod without the
	// label: llm-d's decode filter admits pods that carry no role). It is a
	// decode candidate and prefills its own requests; it is never sent
	// another pod's prefill, as llm-d's prefill filter admits only
	// "prefill".
	RoleBoth Role = iota
	// RolePrefill only prefills: a candidate for prefill_pod, never for pod.
	RolePrefill
	// RoleDecode decodes, and prefills locally when no remote prefill is
	// chosen (the llm-d sidecar forwards to its own engine when no
	// prefiller is named; vLLM's NIXL connector computes what it does not
	// receive).
	RoleDecode
	// RoleEncode is an encoder-only pod of an encode/prefill/decode fleet
	// (multimodal inputs): it produces embeddings, holds no KV blocks of the
	// language model and is chosen for neither stage.
	RoleEncode
	// NumRoles sizes per-role tables.
	NumRoles
)

var roleNames = [NumRoles]string{"both", "prefill", "decode", "encode"}

func (r Role) String() string {
	if r < NumRoles {
		return roleNames[r]
	}
	return "unknown"
}

// Decodes reports whether a pod of role r can be the request's pod.
func (r Role) Decodes() bool { return r == RoleBoth || r == RoleDecode }

// Prefills reports whether a pod of role r can be another pod's prefill_pod.
func (r Role) Prefills() bool { return r == RolePrefill }

// ParseRole reads a role as written in a Pick request or a pod label: the
// values of llm-d's llm-d.ai/role label ("prefill", "decode", "both";
// "prefill-decode" is read as "both", "encode" as RoleEncode) and "" for a
// pod without a role (RoleBoth). Matching is exact, as llm-d's by-label
// filter's is. ok is false for any other value.
func ParseRole(s string) (r Role, ok bool) {
	switch s {
	case "", "both", "prefill-decode":
		return RoleBoth, true
	case "prefill":
		return RolePrefill, true
	case "decode":
		return RoleDecode, true
	case "encode":
		return RoleEncode, true
	}
	return RoleBoth, false
}

// PDParams are the disaggregation decision's two thresholds. A request is
// sent to a prefill pod when both hold:
//
//	NonCachedTokens(decode pod) > MaxLocalPrefillTokens
//	sum of Waiting over the prefill candidates < MaxPrefillWaiting
//
// This is NVIDIA Dynamo's conditional disaggregation
// (ai-dynamo/dynamo examples/llm/components/disagg_router.py,
// PyDisaggregatedRouter.prefill_remote: remote prefill when
// prompt_length*(1-prefix_hit_rate) > max_local_prefill_length and the
// prefill queue is shorter than max_prefill_queue_size, defaults 1000 tokens
// and 2), with the prefix hit read from the chosen decode pod as llm-d's
// prefix-based P/D decider does (llm-d-inference-scheduler
// pkg/plugins/profile/prefix_disaggregation_decider.go: skip the remote
// prefill when the decode pod's non-cached suffix is below nonCachedTokens;
// its default, 0, turns disaggregation off, so its number is no default to
// copy). Dynamo's queue is the prefill pool's shared queue of requests no
// prefill worker has taken yet; here each engine reports its own, so the
// pool's queue is the sum of the prefill candidates' Waiting.
type PDParams struct {
	// MaxLocalPrefillTokens: the decode pod prefills a request itself when
	// it would compute at most this many tokens (default 1000, Dynamo's
	// max_local_prefill_length).
	MaxLocalPrefillTokens int
	// MaxPrefillWaiting: the prefill pool is the bottleneck once its
	// candidates' waiting requests add up to this many (default 2, Dynamo's
	// max_prefill_queue_size); then the decode pod prefills locally.
	// Negative disables the check.
	MaxPrefillWaiting int
}

// DefaultPD are the documented PDParams.
func DefaultPD() PDParams { return PDParams{MaxLocalPrefillTokens: 1000, MaxPrefillWaiting: 2} }

// Validate rejects a negative token threshold.
func (p PDParams) Validate() error {
	if p.MaxLocalPrefillTokens < 0 {
		return errors.New("pd: max local prefill tokens must be >= 0")
	}
	return nil
}

// Split is the disaggregation decision with its reason; it is a metric
// label and an answer field.
type Split uint8

const (
	// SplitNoPrefillPool: no candidate has role prefill; the pod prefills.
	SplitNoPrefillPool Split = iota
	// SplitFewTokens: the pod caches enough of the prompt that the tokens
	// left (NonCached) are at most MaxLocalPrefillTokens; it prefills them.
	SplitFewTokens
	// SplitPrefillBusy: the prefill pool's queue reached MaxPrefillWaiting;
	// the pod prefills rather than wait behind it.
	SplitPrefillBusy
	// SplitRemote: a prefill pod prefills, the pod decodes.
	SplitRemote
	// NumSplits sizes per-split tables.
	NumSplits
)

var splitNames = [NumSplits]string{"no-prefill-pool", "few-uncached-tokens", "prefill-pool-busy", "disaggregated"}

func (s Split) String() string {
	if s < NumSplits {
		return splitNames[s]
	}
	return "unknown"
}

// NonCachedTokens is how many of the request's prompt tokens a pod that
// holds matched leading blocks still computes: the prompt (Tokens, else
// Blocks*BlockSize) less the matched blocks' tokens, at least 0.
func NonCachedTokens(req Request, matched int) int {
	tokens := req.Tokens
	if tokens <= 0 {
		tokens = req.Blocks * req.BlockSize
	}
	return max(tokens-matched*req.BlockSize, 0)
}

// Decide is the disaggregation decision (see PDParams): nonCached is the
// decode pod's NonCachedTokens, prefillPods the number of prefill
// candidates and prefillWaiting the sum of their Waiting.
func (p PDParams) Decide(nonCached, prefillPods, prefillWaiting int) Split {
	switch {
	case prefillPods == 0:
		return SplitNoPrefillPool
	case nonCached <= p.MaxLocalPrefillTokens:
		return SplitFewTokens
	case p.MaxPrefillWaiting >= 0 && prefillWaiting >= p.MaxPrefillWaiting:
		return SplitPrefillBusy
	}
	return SplitRemote
}

// PDChoice is PickPD's answer.
type PDChoice struct {
	// Decode is the index of the request's pod and DecodeReason why the
	// policy chose it among the decode candidates.
	Decode       int
	DecodeReason Reason
	// Prefill is the index of the prefill pod, -1 when the pod prefills
	// locally (Split != SplitRemote); PrefillReason why the policy chose it
	// among the prefill candidates.
	Prefill       int
	PrefillReason Reason
	Split         Split
	// NonCached is the decode pod's NonCachedTokens and PrefillWaiting the
	// prefill pool's queue: the two numbers the decision read.
	NonCached      int
	PrefillWaiting int
	// PrefillPods is the number of prefill candidates.
	PrefillPods int
}

// ErrNoDecodeCandidate is PickPD's answer when no candidate can decode.
var ErrNoDecodeCandidate = errors.New("no candidate can decode (every role is prefill or encode)")

// PickPD chooses the pair for a request over candidates c with roles
// (parallel to c; nil = every pod RoleBoth):
//
//  1. the decode pod: pol over the candidates that decode (RoleBoth,
//     RoleDecode), their own cached prefix counting with their load;
//  2. the decision: pd.Decide with the decode pod's NonCachedTokens and the
//     prefill candidates' queue;
//  3. when it disaggregates, the prefill pod: pol over the RolePrefill
//     candidates, by their own cached prefix and load.
//
// Each candidate's Score and Cost are those of the stage it took part in
// (0 for a stage that did not run). sub and at are the caller's scratch,
// each at least len(c) long, so PickPD allocates nothing. With every role
// RoleBoth it is exactly pol.Pick(req, c). It returns ErrNoDecodeCandidate
// when no candidate decodes.
func PickPD(pol Policy, pd PDParams, req Request, c []Candidate, roles []Role, sub []Candidate, at []int32) (PDChoice, error) {
	ch := PDChoice{Decode: -1, Prefill: -1}
	if len(sub) < len(c) || len(at) < len(c) || (roles != nil && len(roles) != len(c)) {
		return ch, fmt.Errorf("pd: scratch or roles shorter than the %d candidates", len(c))
	}
	role := func(i int) Role {
		if roles == nil {
			return RoleBoth
		}
		return roles[i]
	}
	for i := range c {
		c[i].Score, c[i].Cost = 0, 0
	}
	n := 0
	for i := range c {
		if role(i).Decodes() {
			sub[n], at[n] = c[i], int32(i)
			n++
		} else if role(i).Prefills() {
			ch.PrefillPods++
			ch.PrefillWaiting += c[i].Waiting
		}
	}
	if n == 0 {
		return ch, ErrNoDecodeCandidate
	}
	d, why := pol.Pick(req, sub[:n])
	for j := range n {
		c[at[j]].Score, c[at[j]].Cost = sub[j].Score, sub[j].Cost
	}
	ch.Decode, ch.DecodeReason = int(at[d]), why
	ch.NonCached = NonCachedTokens(req, c[ch.Decode].Matched)
	ch.Split = pd.Decide(ch.NonCached, ch.PrefillPods, ch.PrefillWaiting)
	if ch.Split != SplitRemote {
		return ch, nil
	}
	n = 0
	for i := range c {
		if role(i).Prefills() {
			sub[n], at[n] = c[i], int32(i)
			n++
		}
	}
	p, why := pol.Pick(req, sub[:n])
	for j := range n {
		c[at[j]].Score, c[at[j]].Cost = sub[j].Score, sub[j].Cost
	}
	ch.Prefill, ch.PrefillReason = int(at[p]), why
	return ch, nil
}

// Source is one holder of the request's leading blocks that is none of the
// chosen pods: another candidate, a pod no router offered, a storage tier.
type Source struct {
	// Matched is how many leading blocks of the request it holds.
	Matched int
	// Cached is Matched weighted by storage tier (faster tiers weigh more).
	Cached float64
}

// KVSource chooses where the pod that prefills the request can pull cached
// KV from instead of recomputing it: among s, the source holding the most
// leading blocks (ties: the higher Cached, i.e. the faster tier, then the
// earlier), provided it holds more than have, the most leading blocks any
// chosen pod (the pod, and the prefill pod when there is one) holds. It
// returns -1 when no source holds more: a source that adds nothing is never
// named. llm-d names such a peer for a connector to pull from (its
// p2p-source-producer, as issue 31 reports it);
// the connectors that can pull are vLLM's NIXL, LMCache P2P and Mooncake.
func KVSource(have int, s []Source) int {
	best := -1
	for i := range s {
		x := &s[i]
		if x.Matched <= have {
			continue
		}
		if best < 0 || x.Matched > s[best].Matched || (x.Matched == s[best].Matched && x.Cached > s[best].Cached) {
			best = i
		}
	}
	return best
}
