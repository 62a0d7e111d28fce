// Command mooncakebench replays the Mooncake FAST'25 traces open-loop
// against the indexer, the method of Dynamo's mooncake_bench (the Flash
// Indexer's yardstick): mock engines with 16,384-block pools turn the
// trace into BlockStored / BlockRemoved messages, the trace is compressed
// into shorter windows to raise the offered load, and the saturation point
// is the highest load whose replay keeps up. It prints, per GOMAXPROCS and
// query input, the saturation throughput in logical ops/s and block ops/s,
// the query service p50/p99 at 50% and 90% of it, and memory
// (docs/performance.md explains every parameter).
//
//	go run ./hack/mooncakebench                # the full sweep (minutes)
//	go run ./hack/mooncakebench -short         # seconds: CI's check that it runs
//	go run ./hack/mooncakebench -procs 1 -window 4s -cpuprofile cpu.out   # one replay, profiled
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	rtrace "runtime/trace"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/bench/mooncake"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/sim"
)

var startProfile = func() error { return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mooncakebench:", err)
		os.Exit(1)
	}
}

func run() error {
	def := mooncake.DefaultConfig()
	tracePath := flag.String("trace", "sim/testdata/mooncake/conversation_trace.jsonl.gz", "Mooncake JSONL trace (plain or gzip)")
	workers := flag.Int("workers", def.Workers, "unique inference workers (mooncake_bench --num-unique-inference-workers)")
	lengthFactor := flag.Int("length-factor", def.LengthFactor, "blocks per trace hash id (--trace-length-factor)")
	dupFactor := flag.Int("dup-factor", def.DupFactor, "copies of the trace in disjoint hash spaces (--trace-duplication-factor)")
	capacity := flag.Int("capacity", def.Capacity, "GPU blocks per mock engine (--num-gpu-blocks)")
	blockSize := flag.Int("block-size", def.BlockSize, "tokens per block (the trace's hash ids are 512-token blocks)")
	seed := flag.Uint64("seed", def.Seed, "seed of the request-to-worker draw (--seed)")
	maxReq := flag.Int("max-requests", 0, "use only the first N trace requests (0 = all)")
	algo := flag.String("algo", string(def.Algo), "engines' hash algorithm for -input tokens")
	copyCounts := flag.Bool("copy-counts", false, "engines send remaining_copy_counts with each removal (the applier then keeps no copy counts)")
	input := flag.String("input", "both", "query input: hashes (block hashes given, as find_matches), tokens (token ids, keys computed by the indexer) or both")
	procs := flag.String("procs", "1,2", "GOMAXPROCS values to run, comma-separated")
	eventWorkers := flag.Int("event-workers", 0, "event apply workers (0 = GOMAXPROCS, the daemon's default)")
	queryLanes := flag.Int("query-lanes", 128, "query lanes (mooncake_bench --query-lanes)")
	window := flag.Duration("window", 0, "one replay in this window instead of the sweep")
	fracs := flag.String("fractions", "", "sweep steps as fractions of the overloaded probe's achieved rate (default "+fmtFracs(mooncake.DefaultFractions)+")")
	short := flag.Bool("short", false, "a few seconds: the synthetic trace's first 400 requests, 16 workers of 1,024 blocks, a short sweep")
	verbose := flag.Bool("v", false, "print every replay of the sweep")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the replays (with -window: of that one replay)")
	execTrace := flag.String("exectrace", "", "write a Go execution trace of the replays (go tool trace; -pprof=sync or sched shows where queries waited)")
	applyOnly := flag.Int("apply-only", 0, "instead of replays: apply every event message N times in a row on one goroutine, each time into a fresh index (a fixed amount of work; prints CPU ns per event block)")
	memProfile := flag.String("memprofile", "", "write allocation profiles before (FILE.base) and after the replays")
	flag.Parse()

	cfg := def
	cfg.Shape = mooncake.Shape{Workers: *workers, LengthFactor: *lengthFactor, DupFactor: *dupFactor, Seed: *seed, MaxRequests: *maxReq}
	cfg.Capacity, cfg.BlockSize = *capacity, *blockSize
	a, err := blockkeys.ParseHashAlgo(*algo)
	if err != nil {
		return err
	}
	cfg.Algo = a
	cfg.CopyCounts = *copyCounts
	fractions := mooncake.DefaultFractions
	if *short {
		*tracePath = "sim/testdata/mooncake/synthetic_trace.jsonl.gz"
		cfg.Shape = mooncake.Shape{Workers: 16, LengthFactor: 2, DupFactor: 1, Seed: *seed, MaxRequests: 400}
		cfg.Capacity = 1024
		fractions = []float64{0.8, 0.4}
	}
	if *fracs != "" {
		if fractions, err = parseFracs(*fracs); err != nil {
			return err
		}
	}
	var procList []int
	for _, s := range strings.Split(*procs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-procs: %q is not a positive integer", s)
		}
		procList = append(procList, n)
	}
	var inputs []bool
	switch *input {
	case "hashes":
		inputs = []bool{false}
	case "tokens":
		inputs = []bool{true}
	case "both":
		inputs = []bool{false, true}
	default:
		return fmt.Errorf("-input: want hashes, tokens or both, not %q", *input)
	}

	trace, err := sim.ReadTraceFile(*tracePath)
	if err != nil {
		return err
	}
	profiling := false
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		// Started once the first corpus is built: the profile is the
		// replays', not the preparation's.
		defer func() {
			if profiling {
				pprof.StopCPUProfile()
			}
		}()
		startProfile = func() error {
			if profiling {
				return nil
			}
			profiling = true
			return pprof.StartCPUProfile(f)
		}
	}
	if *execTrace != "" {
		f, err := os.Create(*execTrace)
		if err != nil {
			return err
		}
		defer f.Close()
		tracing := false
		defer func() {
			if tracing {
				rtrace.Stop()
			}
		}()
		prev := startProfile
		startProfile = func() error {
			if !tracing {
				tracing = true
				if err := rtrace.Start(f); err != nil {
					return err
				}
			}
			return prev()
		}
	}
	if *memProfile != "" {
		// The replays' allocations are the difference between the profile
		// written after them and the .base one written before them:
		// go tool pprof -sample_index=alloc_space -base FILE.base BIN FILE
		runtime.MemProfileRate = 64 << 10
		defer writeHeapProfile(*memProfile)
		prev := startProfile
		based := false
		startProfile = func() error {
			if !based {
				based = true
				writeHeapProfile(*memProfile + ".base")
			}
			return prev()
		}
	}

	ctx := context.Background()
	n := len(trace)
	if cfg.MaxRequests > 0 {
		n = min(n, cfg.MaxRequests)
	}
	fmt.Printf("trace %s: %d requests; workers %d, length x%d, copies x%d, %d blocks per engine, %d-token blocks, seed %d\n",
		*tracePath, n, cfg.Workers, cfg.LengthFactor, cfg.DupFactor,
		cfg.Capacity, cfg.BlockSize, cfg.Seed)
	var rows []row
	for _, tokens := range inputs {
		cfg.Tokens = tokens
		t0 := time.Now()
		c, err := mooncake.Build(trace, cfg)
		if err != nil {
			return err
		}
		if err := startProfile(); err != nil {
			return err
		}
		t := c.Totals
		fmt.Printf("\ncorpus (%s, built in %.1fs): %d requests, %d stored + %d removed events in %d messages; "+
			"%d logical ops, %d block ops (%d request + %d stored + %d removed)\n",
			inputName(tokens), time.Since(t0).Seconds(), t.Requests, t.StoredEvents, t.RemovedEvents, t.Batches,
			t.Logical(), t.Blocks(), t.RequestBlocks, t.StoredBlocks, t.RemovedBlocks)
		if *applyOnly > 0 {
			for i := 0; i < *applyOnly; i++ {
				r, err := mooncake.ApplyAll(ctx, c)
				if err != nil {
					return err
				}
				if err := checkEntries(c, r.PodEntries, r.DecodeErrors); err != nil {
					return err
				}
				fmt.Printf("apply-only %d: %d messages, %d event blocks: CPU %.3fs (%.1f ns/block), wall %.3fs (%s block ops/s)\n",
					i+1, r.Batches, r.Blocks, r.CPU.Seconds(), float64(r.CPU.Nanoseconds())/float64(r.Blocks),
					r.Wall.Seconds(), si(float64(r.Blocks)/r.Wall.Seconds()))
			}
			continue
		}
		for _, p := range procList {
			runtime.GOMAXPROCS(p)
			rc := mooncake.RunConfig{EventWorkers: *eventWorkers, QueryLanes: *queryLanes}
			if *window > 0 {
				rc.Window = *window
				r, err := mooncake.Replay(ctx, c, rc)
				if err != nil {
					return err
				}
				printRun(p, 0, r)
				if err := check(c, r); err != nil {
					return err
				}
				continue
			}
			var bad error
			sat, all, err := mooncake.Saturation(ctx, c, rc, fractions, func(pt mooncake.Point) {
				if *verbose {
					printRun(p, pt.Fraction, pt.Result)
				}
				if err := check(c, pt.Result); err != nil && bad == nil {
					bad = err
				}
			})
			if err != nil {
				return err
			}
			if bad != nil {
				return bad
			}
			if sat == nil {
				fmt.Printf("GOMAXPROCS=%d %s: no step kept up (last: %s)\n", p, inputName(tokens), summary(all[len(all)-1].Result))
				continue
			}
			half, err := mooncake.AtLoad(ctx, c, rc, sat.Result, 0.5)
			if err != nil {
				return err
			}
			ninety, err := mooncake.AtLoad(ctx, c, rc, sat.Result, 0.9)
			if err != nil {
				return err
			}
			if *verbose {
				printRun(p, 0.5, half)
				printRun(p, 0.9, ninety)
			}
			for _, r := range []*mooncake.Result{half, ninety} {
				if err := check(c, r); err != nil {
					return err
				}
			}
			rows = append(rows, row{procs: p, tokens: tokens, sat: sat.Result, peak: all[0].Result, half: half, ninety: ninety})
		}
	}
	if len(rows) > 0 {
		printTable(rows)
	}
	return nil
}

type row struct {
	procs                   int
	tokens                  bool
	sat, peak, half, ninety *mooncake.Result
}

func inputName(tokens bool) string {
	if tokens {
		return "token ids"
	}
	return "block hashes"
}

// check fails a replay whose index does not hold, worker by worker,
// exactly the blocks the mock engines hold at the end of the trace.
func check(c *mooncake.Corpus, r *mooncake.Result) error {
	return checkEntries(c, r.PodEntries, r.DecodeErrors)
}

func checkEntries(c *mooncake.Corpus, podEntries []int64, decodeErrors int64) error {
	if decodeErrors != 0 {
		return fmt.Errorf("%d event messages failed to decode", decodeErrors)
	}
	for w, n := range c.Resident {
		if podEntries[w] != int64(n) {
			return fmt.Errorf("worker %d: the index holds %d blocks, its engine %d", w, podEntries[w], n)
		}
	}
	return nil
}

func printRun(procs int, frac float64, r *mooncake.Result) {
	fmt.Printf("  GOMAXPROCS=%d x%.2f window %v: %s\n", procs, frac, r.Window.Round(time.Millisecond), summary(r))
}

func summary(r *mooncake.Result) string {
	return fmt.Sprintf("offered %s / achieved %s logical ops/s, offered %s / achieved %s block ops/s, "+
		"elapsed %v, issue span %v, kept up %v, service p50/p99 %s/%s, end-to-end p99 %s, CPU %.2fs (kernel %.2fs), %d/%d queries matched",
		si(r.OfferedLogical()), si(r.AchievedLogical()), si(r.OfferedBlocks()), si(r.AchievedBlocks()),
		r.Elapsed.Round(time.Millisecond), r.IssueSpan.Round(time.Millisecond), r.KeptUp,
		us(r.Service.P50), us(r.Service.P99), us(r.EndToEnd.P99), r.CPU.Seconds(), r.SysCPU.Seconds(), r.QueriesMatched, r.Totals.Requests)
}

// printTable is the result a reader compares across machines: per
// GOMAXPROCS and input, the saturation point in both units (and per core),
// the query service at 50% and 90% of it, and the index's memory.
func printTable(rows []row) {
	fmt.Println()
	fmt.Println("| GOMAXPROCS | query input | saturation logical ops/s (per core) | saturation block ops/s (per core) | same, the post's unit: request + stored blocks (per core) | overloaded achieved block ops/s | service p50 / p99 at 50% | service p50 / p99 at 90% | index entries, heap |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		s := r.sat
		p := float64(r.procs)
		post := float64(s.Totals.BlogBlocks()) / s.Window.Seconds()
		fmt.Printf("| %d | %s | %s (%s) | %s (%s) | %s (%s) | %s | %s / %s us | %s / %s us | %s, %.0f MB (%.0f B/entry) |\n",
			r.procs, inputName(r.tokens), si(s.OfferedLogical()), si(s.OfferedLogical()/p), si(s.OfferedBlocks()), si(s.OfferedBlocks()/p),
			si(post), si(post/p), si(r.peak.AchievedBlocks()),
			us(r.half.Service.P50), us(r.half.Service.P99), us(r.ninety.Service.P50), us(r.ninety.Service.P99),
			si(float64(s.IndexEntries)), float64(s.HeapBytes)/1e6, float64(s.HeapBytes)/float64(max(s.IndexEntries, 1)))
	}
}

func si(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func us(ns int64) string { return fmt.Sprintf("%.1f", float64(ns)/1e3) }

func parseFracs(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-fractions: %q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func fmtFracs(fs []float64) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

func writeHeapProfile(path string) {
	runtime.GC() // the profile shows allocations as of the last GC
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mooncakebench:", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "mooncakebench:", err)
	}
}
