package main

import "github.com/kvindex/kvindex/sim"

// The simulator's subcommands live in package sim (so its tests exercise
// them directly); this file only registers them.
func init() {
	subcommands["replay"] = subcommand{"replay a Mooncake trace against one block cache (lru, lfu, s3fifo); prints JSON", sim.RunReplay}
	subcommands["simulate"] = subcommand{"simulate a fleet of engines behind each routing policy on a trace", sim.RunSimulate}
	subcommands["genworkload"] = subcommand{"write the generated shared-system-prompt workload as Mooncake JSONL", sim.RunGenWorkload}
}
