// Package routing holds the pick policies: pure functions that turn "how
// much of this request each candidate pod already caches" plus the pods'
// load into one chosen pod and the reason for it.
//
// A policy sees only numbers the caller fills in (Candidate.Load from the
// router, Matched and Cached from the index); it keeps no state, does no I/O
// and allocates nothing, so the daemon's Pick, the simulator and tests all
// run the very same code. Each policy's doc comment gives its formula, its
// defaults and the router it follows.
package routing

import (
	"fmt"
	"math"
	"strings"
)

// Load is what the router reports about one candidate at pick time.
type Load struct {
	// Waiting is the engine's queue of requests not yet scheduled.
	Waiting int
	// Running is the engine's batch of requests being served.
	Running int
	// KVUsage is the share of the engine's KV cache in use, 0..1.
	KVUsage float64
}

// InFlight is the candidate's requests in the engine: running + waiting.
func (l *Load) InFlight() int { return l.Running + l.Waiting }

// Candidate is one pod as a policy sees it. The caller fills Load, Matched
// and Cached; Pick overwrites Score and Cost with the numbers that decided.
type Candidate struct {
	Load
	// Matched is how many leading blocks of the request the pod holds.
	Matched int
	// Cached is Matched weighted by storage tier (a block on GPU counts 1,
	// one that must first be copied back from CPU or disk less): the blocks
	// of prefill the cache saves.
	Cached float64

	// Score is the policy's merit of the candidate (higher is better), and
	// Cost its price (lower is better); each policy documents which of the
	// two decides and what the other one holds.
	Score float64
	Cost  float64
}

// Request is what a policy knows of the request itself.
type Request struct {
	// Blocks is the request's full blocks (the most any pod can match).
	Blocks int
	// Tokens is the prompt length in tokens when known, else
	// Blocks*BlockSize.
	Tokens int
	// BlockSize is tokens per block.
	BlockSize int
}

// Reason says why a policy chose its pod; it is a metric label.
type Reason uint8

const (
	// ReasonOnly: a single candidate.
	ReasonOnly Reason = iota
	// ReasonLowestCost: the cost model's cheapest pod.
	ReasonLowestCost
	// ReasonHighestScore: the weighted scorers' best pod.
	ReasonHighestScore
	// ReasonPrefix: the pod with the best cached prefix that passed the
	// policy's load guard.
	ReasonPrefix
	// ReasonImbalanced: the fleet's load spread tripped the policy's
	// imbalance gate, so prefix was ignored and the least loaded pod won.
	ReasonImbalanced
	// ReasonNoMatch: no candidate caches enough of the request (nothing, or
	// less than the policy's threshold); load decided.
	ReasonNoMatch
	// ReasonOverloaded: pods caching the request were all over the
	// policy's load guard; the least loaded pod won.
	ReasonOverloaded
	// ReasonLeastLoaded: the least-loaded policy.
	ReasonLeastLoaded
	// NumReasons sizes per-reason tables.
	NumReasons
)

var reasonNames = [NumReasons]string{"only-candidate", "lowest-cost", "highest-score", "best-prefix",
	"load-imbalanced", "no-prefix-match", "prefix-holders-overloaded", "least-loaded"}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Policy chooses one candidate. Pick is called with at least one candidate,
// returns an index into c, and writes each candidate's Score and Cost. It
// must not allocate or keep c.
type Policy interface {
	Name() string
	Pick(req Request, c []Candidate) (int, Reason)
}

// Policy names.
const (
	NameCost          = "cost"
	NameWeighted      = "weighted"
	NameAIBrix        = "aibrix"
	NameSGLang        = "sglang"
	NameGuardedPrefix = "guarded-prefix"
	NameLeastLoaded   = "least-loaded"
)

// Names lists every policy, in documentation order.
func Names() []string {
	return []string{NameCost, NameWeighted, NameAIBrix, NameSGLang, NameGuardedPrefix, NameLeastLoaded}
}

// DefaultPolicy is the policy a Pick without one uses: on the Mooncake
// conversation and synthetic traces (kvindexd simulate, 8 pods, docs/simulator.md's
// policy table) it had the lowest mean TTFT of these policies on both.
const DefaultPolicy = NameSGLang

// Params are every policy's knobs. Defaults returns the documented values;
// a zero field is a legal setting, not "default".
type Params struct {
	Cost          CostParams
	Weighted      WeightedParams
	AIBrix        AIBrixParams
	SGLang        SGLangParams
	GuardedPrefix GuardedPrefixParams
	// PD is the disaggregation decision of PickPD.
	PD PDParams
}

// Defaults are the values each policy's doc comment cites.
func Defaults() Params {
	return Params{
		Cost:          CostParams{OverlapWeight: 1, BlocksPerRequest: 0},
		Weighted:      WeightedParams{Prefix: 3, Queue: 2, KVUsage: 2},
		AIBrix:        AIBrixParams{ImbalanceAbs: 16, StdDevFactor: 2},
		SGLang:        SGLangParams{BalanceAbs: 64, BalanceRel: 1.5, CacheThreshold: 0.3},
		GuardedPrefix: GuardedPrefixParams{GuardAbs: 4, MinMatch: 0},
		PD:            DefaultPD(),
	}
}

// New builds the named policy with p's knobs.
func New(name string, p Params) (Policy, error) {
	switch name {
	case NameCost:
		return newCost(p.Cost)
	case NameWeighted:
		return newWeighted(p.Weighted)
	case NameAIBrix:
		return newAIBrix(p.AIBrix)
	case NameSGLang:
		return newSGLang(p.SGLang)
	case NameGuardedPrefix:
		return newGuardedPrefix(p.GuardedPrefix)
	case NameLeastLoaded:
		return LeastLoaded{}, nil
	}
	return nil, fmt.Errorf("unknown pick policy %q (want one of %s)", name, strings.Join(Names(), ", "))
}

// finite reports whether every x is a finite number >= 0.
func finite(xs ...float64) bool {
	for _, x := range xs {
		if !(x >= 0) || math.IsInf(x, 0) {
			return false
		}
	}
	return true
}

// LeastLoaded picks the candidate with the fewest requests in the engine
// (running + waiting); ties go to the lower KV usage, then to the earlier
// candidate. It ignores the cache. It is also the documented answer of the
// router client when the daemon cannot be reached. Cost = in-flight
// requests; Score = 0.
type LeastLoaded struct{}

func (LeastLoaded) Name() string { return NameLeastLoaded }

func (LeastLoaded) Pick(_ Request, c []Candidate) (int, Reason) {
	for i := range c {
		c[i].Score, c[i].Cost = 0, float64(c[i].InFlight())
	}
	if len(c) == 1 {
		return 0, ReasonOnly
	}
	return leastLoaded(c, -1), ReasonLeastLoaded
}

// leastLoaded returns the candidate with the fewest in-flight requests
// (ties: lower KV usage, then earlier), considering only candidates whose
// Running is <= maxRunning when maxRunning >= 0.
func leastLoaded(c []Candidate, maxRunning int) int {
	best := -1
	for i := range c {
		if maxRunning >= 0 && c[i].Running > maxRunning {
			continue
		}
		if best < 0 || lessLoaded(&c[i], &c[best]) {
			best = i
		}
	}
	return best
}

func lessLoaded(a, b *Candidate) bool {
	if la, lb := a.InFlight(), b.InFlight(); la != lb {
		return la < lb
	}
	return a.KVUsage < b.KVUsage
}
