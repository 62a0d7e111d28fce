package sim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvindex/kvindex/sim/cache"
)

// RouterParams are every routing policy's knobs (flags of `kvindexd simulate`).
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

// DefaultRouterParams are the defaults of `kvindexd simulate`'s flags (their
// sources are in sim/README.md); approxCapacity is normally the pods' capacity.
func DefaultRouterParams(pods, blockSize, approxCapacity int) RouterParams {
	return RouterParams{Pods: pods, BlockSize: blockSize, Seed: 1, GuardAbs: 4, SpecTTL: 2, ApproxCapacity: approxCapacity,
		CHWBLHead: 1, CHWBLLoad: 1.25, CHWBLReplicas: 256, AIBrixImbalance: 16, AIBrixStdFactor: 2, AIBrixBlocks: 200000,
		SGLCacheThresh: 0.3, SGLBalanceAbs: 64, SGLBalanceRel: 1.5, SGLTreeBlocks: 32768}
}

// routerFactories builds each policy; precise.go adds the kvindex-backed ones.
var routerFactories = map[string]func(p RouterParams) (Router, error){
	"random":       func(p RouterParams) (Router, error) { return NewRandomRouter(p.Seed), nil },
	"round-robin":  func(RouterParams) (Router, error) { return &RoundRobinRouter{}, nil },
	"least-loaded": func(RouterParams) (Router, error) { return &LeastLoadedRouter{}, nil },
	"chwbl": func(p RouterParams) (Router, error) {
		if p.CHWBLReplicas < 1 || p.CHWBLHead < 1 {
			return nil, errors.New("chwbl: --chwbl-replication and --chwbl-head-blocks must be >= 1")
		}
		return NewCHWBLRouter(p.Pods, p.CHWBLReplicas, p.CHWBLHead, p.CHWBLLoad), nil
	},
	"approx-prefix": func(p RouterParams) (Router, error) {
		if p.ApproxCapacity < 1 {
			return nil, errors.New("approx-prefix: --approx-capacity must be >= 1 block")
		}
		return NewApproxRouter(p.Pods, p.ApproxCapacity, LoadGuard{p.GuardAbs}, p.MinMatch), nil
	},
	"aibrix": func(p RouterParams) (Router, error) {
		if p.Pods > 64 {
			return nil, errors.New("aibrix: the simulated table holds at most 64 pods")
		}
		if p.AIBrixBlocks < 1 {
			return nil, errors.New("aibrix: --aibrix-blocks must be >= 1")
		}
		return NewAIBrixRouter(p.AIBrixImbalance, p.AIBrixStdFactor, p.AIBrixBlocks), nil
	},
	"sglang": func(p RouterParams) (Router, error) {
		if p.SGLTreeBlocks < 1 {
			return nil, errors.New("sglang: --sglang-tree-blocks must be >= 1")
		}
		return NewSGLangRouter(p.Pods, p.SGLCacheThresh, p.SGLBalanceAbs, p.SGLBalanceRel, p.SGLTreeBlocks), nil
	},
}

// RouterOrder is the table order.
var RouterOrder = []string{"random", "round-robin", "least-loaded", "chwbl", "approx-prefix", "aibrix", "sglang", "precise", "precise+spec"}

// NewRouter builds the named policy.
func NewRouter(name string, p RouterParams) (Router, error) {
	f, ok := routerFactories[name]
	if !ok {
		return nil, fmt.Errorf("unknown routing policy %q", name)
	}
	return f(p)
}

// maxPods bounds --pods: the simulator allocates per pod up front.
const maxPods = 4096

// RunSimulate implements `kvindexd simulate`.
func RunSimulate(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	trace := fs.String("trace", "", "Mooncake JSONL trace (plain or .gz)")
	scenario := fs.String("scenario", "", "scenario YAML: vLLM engine model, staged load, schedulers (sim/README.md); other fleet flags are ignored")
	gen := fs.Bool("gen-workload", false, "simulate the generated shared-prefix workload instead of --trace (see --gen-* flags)")
	wl := DefaultWorkload()
	wl.flags(fs, "gen-")
	fc := FleetConfig{Service: DefaultServiceModel()}
	fs.IntVar(&fc.Pods, "pods", 8, "number of pods")
	policy := fs.String("policy", "lru", "per-pod cache policy: lru, lfu, s3fifo")
	capacity := fs.Int("capacity", 1000, "per-pod cache capacity, blocks")
	smallRatio := fs.Float64("small-ratio", 0.1, "s3fifo small queue share")
	maxFreq := fs.Int("max-freq", 3, "s3fifo frequency saturation")
	fs.IntVar(&fc.BlockSize, "block-size", 512, "tokens per block")
	fs.Float64Var(&fc.Speedup, "speedup", 1, "arrival time = trace timestamp / speedup")
	fs.Float64Var(&fc.EventLag, "event-lag", 0.1, "seconds from a pod's prefill end until the router sees its KV events")
	fs.IntVar(&fc.Service.MaxBatch, "max-batch", fc.Service.MaxBatch, "concurrent requests per pod (B)")
	fs.Float64Var(&fc.Service.PrefillBase, "prefill-base", fc.Service.PrefillBase, "seconds per prefill")
	fs.Float64Var(&fc.Service.PrefillPerToken, "prefill-per-token", fc.Service.PrefillPerToken, "seconds per uncached prompt token")
	fs.Float64Var(&fc.Service.DecodePerToken, "decode-per-token", fc.Service.DecodePerToken, "seconds per output token")
	routers := fs.String("routers", strings.Join(RouterOrder, ","), "comma-separated routing policies")
	rp := DefaultRouterParams(0, 0, 0)
	fs.Uint64Var(&rp.Seed, "seed", rp.Seed, "random router seed")
	fs.IntVar(&rp.GuardAbs, "guard-abs", rp.GuardAbs, "precise/approx load guard: eligible while load <= min load + this (-1 = off)")
	fs.Float64Var(&rp.MinMatch, "min-match", rp.MinMatch, "precise/approx: minimum matched share of the prompt to follow the cache")
	fs.Float64Var(&rp.SpecTTL, "spec-ttl", rp.SpecTTL, "precise+spec: speculative entry lifetime, seconds")
	fs.IntVar(&rp.ApproxCapacity, "approx-capacity", rp.ApproxCapacity, "approx-prefix: router LRU blocks per pod (0 = --capacity)")
	fs.IntVar(&rp.CHWBLHead, "chwbl-head-blocks", rp.CHWBLHead, "chwbl: hash_ids hashed as the prompt head")
	fs.Float64Var(&rp.CHWBLLoad, "chwbl-load-factor", rp.CHWBLLoad, "chwbl: mean load factor (KubeAI meanLoadPercentage/100)")
	fs.IntVar(&rp.CHWBLReplicas, "chwbl-replication", rp.CHWBLReplicas, "chwbl: ring points per pod")
	fs.IntVar(&rp.AIBrixImbalance, "aibrix-imbalance-abs", rp.AIBrixImbalance, "aibrix: running-request imbalance gate")
	fs.Float64Var(&rp.AIBrixStdFactor, "aibrix-std-factor", rp.AIBrixStdFactor, "aibrix: mean + k*stddev load guard")
	fs.IntVar(&rp.AIBrixBlocks, "aibrix-blocks", rp.AIBrixBlocks, "aibrix: prefix table blocks")
	fs.Float64Var(&rp.SGLCacheThresh, "sglang-cache-threshold", rp.SGLCacheThresh, "sglang: match ratio to follow the cache")
	fs.IntVar(&rp.SGLBalanceAbs, "sglang-balance-abs", rp.SGLBalanceAbs, "sglang: imbalance abs threshold")
	fs.Float64Var(&rp.SGLBalanceRel, "sglang-balance-rel", rp.SGLBalanceRel, "sglang: imbalance rel threshold")
	fs.IntVar(&rp.SGLTreeBlocks, "sglang-tree-blocks", rp.SGLTreeBlocks, "sglang: router tree bound per pod, blocks (2^26 chars ~ 4 chars/token)")
	replicas := fs.Int("router-replicas", 1, "run R independent replicas of each policy, request i decided by replica i mod R")
	out := fs.String("out", "", "write results: .json or .csv by extension")
	svg := fs.String("svg", "", "write an SVG chart comparing policies")
	md := fs.Bool("markdown", false, "print the table as Markdown too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("simulate: unexpected arguments %v", fs.Args())
	}
	if *scenario != "" {
		if *trace != "" || *gen {
			return errors.New("simulate: --scenario excludes --trace and --gen-workload")
		}
		return runScenarioCommand(*scenario, *out, *svg, *md, stdout)
	}
	fc.Cache = cache.Config{Policy: *policy, Capacity: *capacity, SmallRatio: *smallRatio, MaxFreq: *maxFreq}
	if _, err := cache.New(fc.Cache); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	if fc.Pods < 1 || fc.Pods > maxPods || !(fc.Speedup > 0) || math.IsInf(fc.Speedup, 0) || fc.BlockSize < 1 {
		return fmt.Errorf("simulate: --pods must be in [1, %d], --speedup and --block-size positive", maxPods)
	}
	sv := fc.Service
	for _, x := range []float64{fc.EventLag, sv.PrefillBase, sv.PrefillPerToken, sv.DecodePerToken, rp.SpecTTL, rp.MinMatch} {
		if !(x >= 0) || math.IsInf(x, 0) {
			return errors.New("simulate: times, --spec-ttl and --min-match must be finite and >= 0")
		}
	}
	if *smallRatio <= 0 || *maxFreq < 1 {
		return errors.New("simulate: --small-ratio must be > 0 and --max-freq >= 1")
	}
	rp.Pods, rp.BlockSize, rp.MaxBatch = fc.Pods, fc.BlockSize, fc.Service.MaxBatch
	if *replicas < 1 {
		return errors.New("simulate: --router-replicas must be >= 1")
	}
	if rp.ApproxCapacity == 0 {
		rp.ApproxCapacity = *capacity
	}
	var reqs []Request
	var err error
	var name string
	switch {
	case *gen && *trace != "":
		return errors.New("simulate: --trace and --gen-workload are exclusive")
	case *gen:
		wl.BlockSize = fc.BlockSize
		reqs, err = GenWorkload(wl)
		name = fmt.Sprintf("generated(%dx%d, %d+%d tok, %g rps)", wl.Groups, wl.Prompts, wl.SystemTokens, wl.UserTokens, wl.Rate)
	case *trace == "":
		return errors.New("simulate: --trace or --gen-workload is required")
	default:
		reqs, err = ReadTraceFile(*trace)
		name = filepath.Base(*trace)
	}
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	h, tot := UnboundedHitRate(reqs, fc.BlockSize)
	rep := &Report{Trace: name, Pods: fc.Pods, CachePer: *capacity, Policy: *policy, BlockSize: fc.BlockSize,
		Speedup: fc.Speedup, EventLag: fc.EventLag, Service: fc.Service}
	if tot > 0 {
		rep.Ceiling = float64(h) / float64(tot)
	}
	for _, rn := range strings.Split(*routers, ",") {
		rn = strings.TrimSpace(rn)
		if rn == "" {
			continue
		}
		var r Router
		reps := make([]Router, *replicas)
		for i := range reps {
			// Each replica gets its own seed so random replicas differ.
			rpi := rp
			rpi.Seed = rp.Seed + uint64(i)
			if reps[i], err = NewRouter(rn, rpi); err != nil {
				return fmt.Errorf("simulate: %w", err)
			}
		}
		r = reps[0]
		if *replicas > 1 {
			r = NewReplicatedRouter(reps)
		}
		start := time.Now()
		res, err := Simulate(fc, reqs, r)
		if err != nil {
			return fmt.Errorf("simulate: %s: %w", rn, err)
		}
		res.WallSeconds = time.Since(start).Seconds()
		rep.Results = append(rep.Results, res)
	}
	WriteTable(stdout, rep)
	if *md {
		fmt.Fprintln(stdout)
		WriteMarkdown(stdout, rep)
	}
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error {
			if strings.EqualFold(filepath.Ext(*out), ".csv") {
				return WriteCSV(w, rep)
			}
			return WriteJSON(w, rep)
		}); err != nil {
			return err
		}
	}
	if *svg != "" {
		if err := writeFile(*svg, func(w io.Writer) error { return WriteSVG(w, rep) }); err != nil {
			return err
		}
	}
	return nil
}

func runScenarioCommand(path, out, svg string, md bool, stdout io.Writer) error {
	sc, err := ReadScenarioFile(path)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	rep, err := RunScenario(sc)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	WriteScenarioTable(stdout, rep)
	if md {
		fmt.Fprintln(stdout)
		WriteScenarioMarkdown(stdout, rep)
	}
	if out != "" {
		if err := writeFile(out, func(w io.Writer) error { return WriteScenarioJSON(w, rep) }); err != nil {
			return err
		}
	}
	if svg != "" {
		if err := writeFile(svg, func(w io.Writer) error { return WriteScenarioSVG(w, rep) }); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
