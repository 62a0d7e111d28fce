package sim

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/kvindex/kvindex/sim/cache"
)

// RunReplay implements `kvindexd replay`: one cache, the replay semantics of sim/README.md,
// one JSON object on stdout.
func RunReplay(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	trace := fs.String("trace", "", "Mooncake JSONL trace (plain or .gz); - = stdin")
	policy := fs.String("policy", "lru", "eviction policy: lru, lfu or s3fifo")
	capacity := fs.Int("capacity", 0, "cache capacity in blocks (required)")
	blockSize := fs.Int("block-size", 512, "tokens per block (Mooncake traces: 512)")
	smallRatio := fs.Float64("small-ratio", 0.1, "s3fifo: small queue share of capacity (round-half-even)")
	maxFreq := fs.Int("max-freq", 3, "s3fifo: frequency saturation")
	perRequest := fs.Bool("per-request", false, "add per_request [{prompt_tokens, hit_tokens}]")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("replay: unexpected arguments %v", fs.Args())
	}
	if *trace == "" {
		return errors.New("replay: --trace is required")
	}
	if *blockSize < 1 {
		return fmt.Errorf("replay: --block-size must be >= 1, got %d", *blockSize)
	}
	if *smallRatio <= 0 || *maxFreq < 1 {
		return errors.New("replay: --small-ratio must be > 0 and --max-freq >= 1")
	}
	p, err := cache.New(cache.Config{Policy: *policy, Capacity: *capacity, SmallRatio: *smallRatio, MaxFreq: *maxFreq})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	var reqs []Request
	if *trace == "-" {
		reqs, err = ReadTrace(stdin)
	} else {
		reqs, err = ReadTraceFile(*trace)
	}
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	res := Replay(reqs, p, *blockSize, *perRequest)
	enc := json.NewEncoder(stdout)
	return enc.Encode(res)
}
