package kvsimcmd

import (
	"flag"
	"io"

	"github.com/kvindex/kvindex/sim"
)

// workloadFlags binds the generated workload's shape to fs, each flag named
// prefix + its name.
func workloadFlags(fs *flag.FlagSet, c *sim.WorkloadConfig, prefix string) {
	fs.IntVar(&c.Groups, prefix+"groups", c.Groups, "workload: groups sharing one system prompt")
	fs.IntVar(&c.Prompts, prefix+"prompts", c.Prompts, "workload: distinct user prompts per group")
	fs.IntVar(&c.SystemTokens, prefix+"system-tokens", c.SystemTokens, "workload: system prompt tokens")
	fs.IntVar(&c.UserTokens, prefix+"user-tokens", c.UserTokens, "workload: user prompt tokens")
	fs.IntVar(&c.OutputTokens, prefix+"output-tokens", c.OutputTokens, "workload: output tokens")
	fs.Float64Var(&c.Rate, prefix+"rate", c.Rate, "workload: mean arrival rate, requests/s (Poisson)")
	fs.IntVar(&c.Rounds, prefix+"rounds", c.Rounds, "workload: times each (group, prompt) is sent")
	fs.Uint64Var(&c.Seed, prefix+"seed", c.Seed, "workload: arrival seed")
}

// GenWorkload implements `kvsim genworkload`: writes Mooncake JSONL.
func GenWorkload(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("genworkload")
	c := sim.DefaultWorkload()
	workloadFlags(fs, &c, "")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per block")
	out := fs.String("out", "-", "output file (- = stdout)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	reqs, err := sim.GenWorkload(c)
	if err != nil {
		return err
	}
	if *out == "-" {
		return sim.WriteTrace(stdout, reqs)
	}
	return writeFile(*out, func(w io.Writer) error { return sim.WriteTrace(w, reqs) })
}
