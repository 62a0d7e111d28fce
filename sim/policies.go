package sim

import (
	"errors"
	"fmt"
	"time"
)

// RouterParams are every routing policy's knobs (the flags of `kvsim simulate`).
type RouterParams struct {
	Pods, BlockSize int
	MaxBatch        int // pick:*: engine batch, to split a pod's load into running and waiting
	Seed            uint64
	GuardAbs        int     // precise, precise+spec, approx-prefix
	MinMatch        float64 // precise, precise+spec, approx-prefix
	SpecTTL         float64 // precise+spec, seconds
	ApproxCapacity  int     // approx-prefix: blocks per pod in the router's LRU
	CHWBLHead       int
	CHWBLLoad       float64
	CHWBLReplicas   int
	AIBrixImbalance int
	AIBrixStdFactor float64
	AIBrixBlocks    int
	SGLCacheThresh  float64
	SGLBalanceAbs   int
	SGLBalanceRel   float64
	SGLTreeBlocks   int
}

// DefaultRouterParams are the defaults of `kvsim simulate`'s flags (their
// sources are in docs/simulator.md); approxCapacity is normally the pods' capacity.
func DefaultRouterParams(pods, blockSize, approxCapacity int) RouterParams {
	return RouterParams{Pods: pods, BlockSize: blockSize, Seed: 1, GuardAbs: 4, SpecTTL: 2, ApproxCapacity: approxCapacity,
		CHWBLHead: 1, CHWBLLoad: 1.25, CHWBLReplicas: 256, AIBrixImbalance: 16, AIBrixStdFactor: 2, AIBrixBlocks: 200000,
		SGLCacheThresh: 0.3, SGLBalanceAbs: 64, SGLBalanceRel: 1.5, SGLTreeBlocks: 32768}
}

// routerFactories builds each policy; precise.go adds the kvindex-backed ones.
var routerFactories = map[string]func(p RouterParams) (router, error){
	"random":       func(p RouterParams) (router, error) { return newRandomRouter(p.Seed), nil },
	"round-robin":  func(RouterParams) (router, error) { return &roundRobinRouter{}, nil },
	"least-loaded": func(RouterParams) (router, error) { return &leastLoadedRouter{}, nil },
	"chwbl": func(p RouterParams) (router, error) {
		if p.CHWBLReplicas < 1 || p.CHWBLHead < 1 {
			return nil, errors.New("chwbl: --chwbl-replication and --chwbl-head-blocks must be >= 1")
		}
		return newCHWBLRouter(p.Pods, p.CHWBLReplicas, p.CHWBLHead, p.CHWBLLoad), nil
	},
	"approx-prefix": func(p RouterParams) (router, error) {
		if p.ApproxCapacity < 1 {
			return nil, errors.New("approx-prefix: --approx-capacity must be >= 1 block")
		}
		return newApproxRouter(p.Pods, p.ApproxCapacity, loadGuard{p.GuardAbs}, p.MinMatch), nil
	},
	"aibrix": func(p RouterParams) (router, error) {
		if p.Pods > 64 {
			return nil, errors.New("aibrix: the simulated table holds at most 64 pods")
		}
		if p.AIBrixBlocks < 1 {
			return nil, errors.New("aibrix: --aibrix-blocks must be >= 1")
		}
		return newAIBrixRouter(p.AIBrixImbalance, p.AIBrixStdFactor, p.AIBrixBlocks), nil
	},
	"sglang": func(p RouterParams) (router, error) {
		if p.SGLTreeBlocks < 1 {
			return nil, errors.New("sglang: --sglang-tree-blocks must be >= 1")
		}
		return newSGLangRouter(p.Pods, p.SGLCacheThresh, p.SGLBalanceAbs, p.SGLBalanceRel, p.SGLTreeBlocks), nil
	},
}

// RouterOrder is the table order.
var RouterOrder = []string{"random", "round-robin", "least-loaded", "chwbl", "approx-prefix", "aibrix", "sglang", "precise", "precise+spec"}

// newRouter builds the named policy.
func newRouter(name string, p RouterParams) (router, error) {
	f, ok := routerFactories[name]
	if !ok {
		return nil, fmt.Errorf("unknown routing policy %q", name)
	}
	return f(p)
}

// MaxPods bounds a fleet's size: the simulator allocates per pod up front.
const MaxPods = 4096

// SimulateTrace runs reqs (named trace in the report) through the fleet fc
// once per policy in policies, each with replicas independent router
// instances (request i decided by replica i mod replicas, as a router
// deployment of that many instances does; KV events reach every replica).
// rp's fleet fields (Pods, BlockSize, MaxBatch) are taken from fc; a zero
// ApproxCapacity means the pods' cache capacity.
func SimulateTrace(trace string, reqs []Request, fc FleetConfig, rp RouterParams, policies []string, replicas int) (*Report, error) {
	if replicas < 1 {
		return nil, errors.New("router replicas must be >= 1")
	}
	rp.Pods, rp.BlockSize, rp.MaxBatch = fc.Pods, fc.BlockSize, fc.Service.MaxBatch
	if rp.ApproxCapacity == 0 {
		rp.ApproxCapacity = fc.Cache.Capacity
	}
	h, tot := unboundedHitRate(reqs, fc.BlockSize)
	rep := &Report{Trace: trace, Pods: fc.Pods, CachePer: fc.Cache.Capacity, Policy: fc.Cache.Policy, BlockSize: fc.BlockSize,
		Speedup: fc.Speedup, EventLag: fc.EventLag, Service: fc.Service}
	if tot > 0 {
		rep.Ceiling = float64(h) / float64(tot)
	}
	for _, name := range policies {
		reps := make([]router, replicas)
		for i := range reps {
			// Each replica gets its own seed so random replicas differ.
			rpi := rp
			rpi.Seed = rp.Seed + uint64(i)
			var err error
			if reps[i], err = newRouter(name, rpi); err != nil {
				return nil, err
			}
		}
		r := reps[0]
		if replicas > 1 {
			r = newReplicatedRouter(reps)
		}
		start := time.Now()
		res, err := simulate(fc, reqs, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		res.WallSeconds = time.Since(start).Seconds()
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}
