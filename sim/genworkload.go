package sim

import (
	"errors"
	"math"
	"math/rand/v2"
)

// WorkloadConfig is a shared-prefix benchmark shape: Groups groups of users each
// sharing a long system prompt, Prompts distinct user prompts per group,
// requests cycling through the groups ("alternated among 230 prompt groups,
// each containing 5 unique user prompts; 8,000-token system prompt + 1,000-
// token user prompt, 1,000 output tokens"), Poisson arrivals at Rate req/s.
type WorkloadConfig struct {
	Groups, Prompts                        int
	SystemTokens, UserTokens, OutputTokens int
	Rate                                   float64 // requests per second
	Rounds                                 int     // times every (group, prompt) is sent
	BlockSize                              int
	Seed                                   uint64
}

// DefaultWorkload is that shape (230 groups x 5 prompts) at 10 requests/s, each prompt once.
func DefaultWorkload() WorkloadConfig {
	return WorkloadConfig{Groups: 230, Prompts: 5, SystemTokens: 8000, UserTokens: 1000, OutputTokens: 1000,
		Rate: 10, Rounds: 1, BlockSize: 512, Seed: 1}
}

// GenWorkload builds the trace. Request i goes to group i%Groups, prompt
// (i/Groups)%Prompts. Block hash_ids are prefix-chained like Mooncake's: the
// blocks lying wholly inside the system prompt are shared by the group; every
// later block (the one straddling system and user text, and the user's) is
// specific to (group, prompt).
func GenWorkload(c WorkloadConfig) ([]Request, error) {
	if c.Groups < 1 || c.Prompts < 1 || c.Rounds < 1 || c.BlockSize < 1 || c.SystemTokens < 0 || c.UserTokens < 0 ||
		c.OutputTokens < 0 || !(c.Rate > 0) || math.IsInf(c.Rate, 0) || c.SystemTokens+c.UserTokens < 1 {
		return nil, errors.New("genworkload: groups, prompts, rounds, block size, rate and prompt length must be positive")
	}
	total := c.SystemTokens + c.UserTokens
	nBlocks := (total + c.BlockSize - 1) / c.BlockSize
	shared := c.SystemTokens / c.BlockSize
	var next uint64
	groupIDs := make([][]uint64, c.Groups)
	promptIDs := make(map[[2]int][]uint64)
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	n := c.Groups * c.Prompts * c.Rounds
	out := make([]Request, 0, n)
	t := 0.0
	for i := 0; i < n; i++ {
		g, p := i%c.Groups, (i/c.Groups)%c.Prompts
		if groupIDs[g] == nil {
			groupIDs[g] = make([]uint64, shared)
			for b := range groupIDs[g] {
				groupIDs[g][b] = next
				next++
			}
		}
		tail, ok := promptIDs[[2]int{g, p}]
		if !ok {
			tail = make([]uint64, nBlocks-shared)
			for b := range tail {
				tail[b] = next
				next++
			}
			promptIDs[[2]int{g, p}] = tail
		}
		ids := make([]uint64, 0, nBlocks)
		ids = append(append(ids, groupIDs[g]...), tail...)
		out = append(out, Request{Timestamp: int64(t * 1000), InputLength: total, OutputLength: c.OutputTokens, HashIDs: ids})
		t += rng.ExpFloat64() / c.Rate
	}
	return out, nil
}
