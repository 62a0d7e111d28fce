// Command kvsim is the simulator beside the daemon: it replays request
// traces (Mooncake JSONL) or scenario files (vLLM pods behind llm-d / GIE
// scheduler profiles) against routing policies and reports hit rates,
// latencies and throughput. docs/simulator.md is its manual.
//
//	kvsim simulate --scenario FILE.yaml   (or --trace FILE, --gen-workload)
//	kvsim replay --trace FILE --capacity N
//	kvsim genworkload [--out FILE]
//
// `kvindexd simulate` (and `replay`, `genworkload`) run the same code.
package main

import (
	"os"

	"github.com/kvindex/kvindex/internal/kvsimcmd"
)

func main() {
	os.Exit(kvsimcmd.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
