package kvsimcmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/sim/cache"
)

// Simulate implements `kvsim simulate`: a trace (or the generated
// workload) through the trace fleet model, or a scenario file through the
// vLLM engine model.
func Simulate(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("simulate")
	trace := fs.String("trace", "", "Mooncake JSONL trace (plain or .gz)")
	scenario := fs.String("scenario", "", "scenario YAML: vLLM engine model, staged load, schedulers (docs/simulator.md); other fleet flags are ignored")
	gen := fs.Bool("gen-workload", false, "simulate the generated shared-prefix workload instead of --trace (see --gen-* flags)")
	wl := sim.DefaultWorkload()
	workloadFlags(fs, &wl, "gen-")
	fc := sim.FleetConfig{Service: sim.DefaultServiceModel()}
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
	routers := fs.String("routers", strings.Join(sim.RouterOrder, ","), "comma-separated routing policies")
	rp := sim.DefaultRouterParams(0, 0, 0)
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
	replicas := fs.Int("router-replicas", 1, "run R independent replicas of each policy, request i decided by replica i mod R "+
		"(with --scenario: overrides the file's router_replicas)")
	out := fs.String("out", "", "write results: .json or .csv by extension")
	svg := fs.String("svg", "", "write an SVG chart comparing policies")
	md := fs.Bool("markdown", false, "print the table as Markdown too")
	pdOn := fs.Bool("pd", false, "compare P/D routings on a prefill/decode fleet (docs/simulator.md, \"P/D fleet model\"); "+
		"uses --trace, --gen-workload or --multi-turn and the pod flags (--capacity, --policy, --max-batch, --prefill-*, --decode-per-token)")
	pdc := sim.DefaultPDConfig()
	fs.IntVar(&pdc.PrefillPods, "prefill-pods", pdc.PrefillPods, "--pd: prefill pods")
	fs.IntVar(&pdc.DecodePods, "decode-pods", pdc.DecodePods, "--pd: decode pods (the aggregated fleet has prefill + decode pods of role both)")
	fs.IntVar(&pdc.DecodeCapacity, "decode-capacity", pdc.DecodeCapacity, "--pd: concurrent sequences of a decode pod")
	fs.Float64Var(&pdc.TransferPerBlock, "transfer-per-block", pdc.TransferPerBlock, "--pd: seconds to move one block's KV between pods")
	fs.IntVar(&pdc.PD.MaxLocalPrefillTokens, "pd-max-local-prefill", pdc.PD.MaxLocalPrefillTokens,
		"--pd: pd-conditional prefills on the decode pod when it would compute at most this many tokens")
	fs.IntVar(&pdc.PD.MaxPrefillWaiting, "pd-max-prefill-waiting", pdc.PD.MaxPrefillWaiting,
		"--pd: pd-conditional prefills on the decode pod once the prefill pods' waiting requests add up to this (-1: never)")
	pdRouters := fs.String("pd-routers", strings.Join(sim.PDRouterOrder, ","), "--pd: comma-separated P/D routers")
	pdSens := fs.Bool("pd-sensitivity", false, "--pd: also run each of "+strings.Join(sim.PDScaleKeys, ", ")+
		" at x0.5 and x2 and print the sensitivity table (Markdown)")
	multi := fs.Bool("multi-turn", false, "simulate the generated multi-turn chat workload (see --mt-* flags)")
	mt := sim.DefaultMultiTurn()
	fs.IntVar(&mt.Conversations, "mt-conversations", mt.Conversations, "--multi-turn: conversations")
	fs.IntVar(&mt.TurnsMin, "mt-turns-min", mt.TurnsMin, "--multi-turn: fewest turns of a conversation")
	fs.IntVar(&mt.TurnsMax, "mt-turns-max", mt.TurnsMax, "--multi-turn: most turns of a conversation")
	fs.IntVar(&mt.SystemTokens, "mt-system-tokens", mt.SystemTokens, "--multi-turn: shared system prompt tokens")
	fs.IntVar(&mt.UserTokens, "mt-user-tokens", mt.UserTokens, "--multi-turn: mean user message tokens")
	fs.IntVar(&mt.OutputTokens, "mt-output-tokens", mt.OutputTokens, "--multi-turn: mean answer tokens")
	fs.Float64Var(&mt.Rate, "mt-rate", mt.Rate, "--multi-turn: conversations started per second")
	fs.Float64Var(&mt.ThinkMin, "mt-think-min", mt.ThinkMin, "--multi-turn: fixed seconds between a turn and the next")
	fs.Float64Var(&mt.ThinkMean, "mt-think-mean", mt.ThinkMean, "--multi-turn: mean of the exponential part of the gap")
	fs.Uint64Var(&mt.Seed, "mt-seed", mt.Seed, "--multi-turn: seed")
	var scales scaleFlag
	fs.Var(&scales, "scale", "with --scenario: KEY=FACTOR multiplies a scenario constant (repeatable; keys: "+
		strings.Join(sim.ScaleKeys, ", ")+")")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *scenario != "" {
		if *trace != "" || *gen {
			return errors.New("--scenario excludes --trace and --gen-workload")
		}
		var reps *int // the file's router_replicas unless the flag is given
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "router-replicas" {
				reps = replicas
			}
		})
		return runScenario(*scenario, scales, reps, *out, *svg, *md, stdout)
	}
	if len(scales) > 0 {
		return errors.New("--scale needs --scenario")
	}
	fc.Cache = cache.Config{Policy: *policy, Capacity: *capacity, SmallRatio: *smallRatio, MaxFreq: *maxFreq}
	if _, err := cache.New(fc.Cache); err != nil {
		return err
	}
	if fc.Pods < 1 || fc.Pods > sim.MaxPods || !(fc.Speedup > 0) || math.IsInf(fc.Speedup, 0) || fc.BlockSize < 1 {
		return fmt.Errorf("--pods must be in [1, %d], --speedup and --block-size positive", sim.MaxPods)
	}
	sv := fc.Service
	for _, x := range []float64{fc.EventLag, sv.PrefillBase, sv.PrefillPerToken, sv.DecodePerToken, rp.SpecTTL, rp.MinMatch} {
		if !(x >= 0) || math.IsInf(x, 0) {
			return errors.New("times, --spec-ttl and --min-match must be finite and >= 0")
		}
	}
	if *smallRatio <= 0 || *maxFreq < 1 {
		return errors.New("--small-ratio must be > 0 and --max-freq >= 1")
	}
	if *replicas < 1 {
		return errors.New("--router-replicas must be >= 1")
	}
	var reqs []sim.Request
	var err error
	var name string
	switch {
	case (*gen && *trace != "") || (*multi && (*gen || *trace != "")):
		return errors.New("--trace, --gen-workload and --multi-turn are exclusive")
	case *multi:
		mt.BlockSize = fc.BlockSize
		reqs, err = sim.GenMultiTurn(mt)
		name = fmt.Sprintf("multi-turn(%d conversations of %d-%d turns, %g/s)", mt.Conversations, mt.TurnsMin, mt.TurnsMax, mt.Rate)
	case *gen:
		wl.BlockSize = fc.BlockSize
		reqs, err = sim.GenWorkload(wl)
		name = fmt.Sprintf("generated(%dx%d, %d+%d tok, %g rps)", wl.Groups, wl.Prompts, wl.SystemTokens, wl.UserTokens, wl.Rate)
	case *trace == "":
		return errors.New("--trace, --gen-workload, --multi-turn or --scenario is required")
	default:
		reqs, err = sim.ReadTraceFile(*trace)
		name = filepath.Base(*trace)
	}
	if err != nil {
		return err
	}
	if *pdOn {
		pdc.Cache, pdc.Service, pdc.BlockSize, pdc.Speedup, pdc.EventLag = fc.Cache, fc.Service, fc.BlockSize, fc.Speedup, fc.EventLag
		return runPD(name, reqs, pdc, splitList(*pdRouters), *pdSens, *md, *out, stdout)
	}
	var policies []string
	for _, rn := range strings.Split(*routers, ",") {
		if rn = strings.TrimSpace(rn); rn != "" {
			policies = append(policies, rn)
		}
	}
	rep, err := sim.SimulateTrace(name, reqs, fc, rp, policies, *replicas)
	if err != nil {
		return err
	}
	sim.WriteTable(stdout, rep)
	if *md {
		fmt.Fprintln(stdout)
		sim.WriteMarkdown(stdout, rep)
	}
	if *out != "" {
		if err := writeFile(*out, func(w io.Writer) error {
			if strings.EqualFold(filepath.Ext(*out), ".csv") {
				return sim.WriteCSV(w, rep)
			}
			return sim.WriteJSON(w, rep)
		}); err != nil {
			return err
		}
	}
	if *svg != "" {
		return writeFile(*svg, func(w io.Writer) error { return sim.WriteSVG(w, rep) })
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// runPD is `simulate --pd`: the P/D routers on one fleet, optionally with
// the constants' sensitivity.
func runPD(name string, reqs []sim.Request, cfg sim.PDConfig, routers []string, sens, md bool, out string, stdout io.Writer) error {
	if sens {
		rows, err := sim.PDSensitivity(name, reqs, cfg, routers)
		if err != nil {
			return err
		}
		sim.WritePDTable(stdout, rows[0].Report)
		if md {
			fmt.Fprintln(stdout)
			sim.WritePDMarkdown(stdout, rows[0].Report)
		}
		fmt.Fprintln(stdout)
		sim.WritePDSensitivityMarkdown(stdout, rows)
		if out != "" {
			return writeFile(out, func(w io.Writer) error { return sim.WritePDJSON(w, rows) })
		}
		return nil
	}
	rep, err := sim.RunPD(name, reqs, cfg, routers)
	if err != nil {
		return err
	}
	sim.WritePDTable(stdout, rep)
	if md {
		fmt.Fprintln(stdout)
		sim.WritePDMarkdown(stdout, rep)
	}
	if out != "" {
		return writeFile(out, func(w io.Writer) error { return sim.WritePDJSON(w, rep) })
	}
	return nil
}

// scaleFlag collects --scale KEY=FACTOR.
type scaleFlag []struct {
	key    string
	factor float64
}

func (s *scaleFlag) String() string { return fmt.Sprint(*s) }

func (s *scaleFlag) Set(v string) error {
	k, f, ok := strings.Cut(v, "=")
	x, err := strconv.ParseFloat(f, 64)
	if !ok || err != nil {
		return fmt.Errorf("want KEY=FACTOR, got %q", v)
	}
	*s = append(*s, struct {
		key    string
		factor float64
	}{k, x})
	return nil
}

// runScenario runs the scenario at path; a non-nil replicas replaces its
// router_replicas.
func runScenario(path string, scales scaleFlag, replicas *int, out, svg string, md bool, stdout io.Writer) error {
	sc, err := sim.ReadScenarioFile(path)
	if err != nil {
		return err
	}
	if replicas != nil {
		if err := sc.SetRouterReplicas(*replicas); err != nil {
			return err
		}
	}
	for _, s := range scales {
		if err := sc.Scale(s.key, s.factor); err != nil {
			return err
		}
	}
	rep, err := sim.RunScenario(sc)
	if err != nil {
		return err
	}
	sim.WriteScenarioTable(stdout, rep)
	if md {
		fmt.Fprintln(stdout)
		sim.WriteScenarioMarkdown(stdout, rep)
	}
	if out != "" {
		if err := writeFile(out, func(w io.Writer) error { return sim.WriteScenarioJSON(w, rep) }); err != nil {
			return err
		}
	}
	if svg != "" {
		return writeFile(svg, func(w io.Writer) error { return sim.WriteScenarioSVG(w, rep) })
	}
	return nil
}
