package kvsimcmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvindex/kvindex/sim"
	"github.com/kvindex/kvindex/sim/cache"
)

// Replay implements `kvsim replay`: one cache, the replay semantics of
// docs/simulator.md, one JSON object on stdout.
func Replay(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay")
	trace := fs.String("trace", "", "Mooncake JSONL trace (plain or .gz); - = stdin")
	policy := fs.String("policy", "lru", "eviction policy: lru, lfu or s3fifo")
	capacity := fs.Int("capacity", 0, "cache capacity in blocks (required)")
	blockSize := fs.Int("block-size", 512, "tokens per block (Mooncake traces: 512)")
	smallRatio := fs.Float64("small-ratio", 0.1, "s3fifo: small queue share of capacity (round-half-even)")
	maxFreq := fs.Int("max-freq", 3, "s3fifo: frequency saturation")
	perRequest := fs.Bool("per-request", false, "add per_request [{prompt_tokens, hit_tokens}]")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *trace == "" {
		return errors.New("--trace is required")
	}
	if *blockSize < 1 {
		return fmt.Errorf("--block-size must be >= 1, got %d", *blockSize)
	}
	if *smallRatio <= 0 || *maxFreq < 1 {
		return errors.New("--small-ratio must be > 0 and --max-freq >= 1")
	}
	p, err := cache.New(cache.Config{Policy: *policy, Capacity: *capacity, SmallRatio: *smallRatio, MaxFreq: *maxFreq})
	if err != nil {
		return err
	}
	var reqs []sim.Request
	if *trace == "-" {
		reqs, err = sim.ReadTrace(stdin)
	} else {
		reqs, err = sim.ReadTraceFile(*trace)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(sim.Replay(reqs, p, *blockSize, *perRequest))
}
