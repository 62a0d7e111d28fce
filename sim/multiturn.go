package sim

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
)

// MultiTurnConfig is a chat workload whose conversations come back turn
// after turn with a longer history: turn k's prompt is the shared system
// prompt, every earlier user message and answer, and a new user message.
// It is what makes a decode pod's own prefix cache matter under P/D: the
// pod that decoded turn k holds the history including the answer, which no
// prefill pod ever computed.
//
// Lengths are drawn uniformly in [x/2, 3x/2] around the configured means;
// turns per conversation uniformly in [TurnsMin, TurnsMax]. Conversations
// start as a Poisson process of Rate per second; turn k+1 is sent
// ThinkMin + Exp(ThinkMean) seconds after turn k was sent (open loop: the
// arrival times are fixed in advance, so on an overloaded fleet a turn can
// arrive before the previous answer ended; PDResult.EarlyTurns counts them).
type MultiTurnConfig struct {
	Conversations int
	TurnsMin      int
	TurnsMax      int
	SystemTokens  int // shared by every conversation
	UserTokens    int // mean tokens of a user message
	OutputTokens  int // mean tokens of an answer
	Rate          float64
	ThinkMin      float64 // seconds
	ThinkMean     float64 // seconds, exponential part
	BlockSize     int
	Seed          uint64
}

// DefaultMultiTurn is the multi-turn scenario of docs/simulator.md's P/D
// section. Its shape is an assumption chosen to be a chat assistant: a
// 1,024-token system prompt, 4-10 turns of ~600-token user messages and
// ~400-token answers (histories reach ~10k tokens, about the Mooncake
// conversation trace's mean input of 12k), 20-60 s between turns.
func DefaultMultiTurn() MultiTurnConfig {
	return MultiTurnConfig{Conversations: 400, TurnsMin: 4, TurnsMax: 10, SystemTokens: 1024, UserTokens: 600,
		OutputTokens: 400, Rate: 0.5, ThinkMin: 20, ThinkMean: 20, BlockSize: 512, Seed: 1}
}

// GenMultiTurn builds the workload as a trace in arrival order. Block ids
// follow Mooncake's convention (ceil(input/BlockSize) ids per request,
// prefix-chained): a full block wholly inside the system prompt is shared
// by every conversation, every other full block belongs to its
// conversation and position, and a trailing partial block is unique to its
// request. OutputHashIDs are the conversation blocks the answer completes,
// the ones the next turn's prompt starts with.
func GenMultiTurn(c MultiTurnConfig) ([]Request, error) {
	if c.Conversations < 1 || c.TurnsMin < 1 || c.TurnsMax < c.TurnsMin || c.SystemTokens < 0 || c.UserTokens < 1 ||
		c.OutputTokens < 1 || c.BlockSize < 1 || !(c.Rate > 0) || math.IsInf(c.Rate, 0) || !finiteNonNeg(c.ThinkMin) ||
		!finiteNonNeg(c.ThinkMean) {
		return nil, errors.New("multiturn: conversations, turns, user/output tokens, block size and rate must be positive, think times >= 0")
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7a11c0de))
	draw := func(mean int) int { return max(1, mean/2+rng.IntN(mean+1)) }
	sharedBlocks := c.SystemTokens / c.BlockSize
	convBlock := func(conv, j int) uint64 {
		if j < sharedBlocks {
			return uint64(j)
		}
		return mix64(uint64(conv+1)<<32 | uint64(j))
	}
	type timed struct {
		at   float64
		r    Request
		prev int // index into out of the previous turn, -1: none
	}
	var out []timed
	nreq := 0
	start := 0.0
	for conv := 0; conv < c.Conversations; conv++ {
		start += rng.ExpFloat64() / c.Rate
		at := start
		turns := c.TurnsMin + rng.IntN(c.TurnsMax-c.TurnsMin+1)
		history := c.SystemTokens // tokens before this turn's user message
		for k := 0; k < turns; k++ {
			in := history + draw(c.UserTokens)
			outTok := draw(c.OutputTokens)
			full := in / c.BlockSize
			ids := make([]uint64, 0, full+1)
			for j := 0; j < full; j++ {
				ids = append(ids, convBlock(conv, j))
			}
			if in%c.BlockSize != 0 {
				ids = append(ids, mix64(uint64(nreq)<<1|1^0x5bd1e995))
			}
			var outIDs []uint64
			for j := full; j < (in+outTok)/c.BlockSize; j++ {
				outIDs = append(outIDs, convBlock(conv, j))
			}
			prev := -1
			if k > 0 {
				prev = len(out) - 1
			}
			out = append(out, timed{at, Request{InputLength: in, OutputLength: outTok, HashIDs: ids, OutputHashIDs: outIDs}, prev})
			nreq++
			history = in + outTok
			at += c.ThinkMin + rng.ExpFloat64()*c.ThinkMean
		}
	}
	order := make([]int, len(out))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool { return out[order[i]].at < out[order[j]].at })
	pos := make([]int, len(out)) // generation index -> trace index
	for i, g := range order {
		pos[g] = i
	}
	reqs := make([]Request, len(out))
	for i, g := range order {
		reqs[i] = out[g].r
		reqs[i].Timestamp = int64(math.Round(out[g].at * 1000))
		if p := out[g].prev; p >= 0 {
			reqs[i].prev = pos[p] + 1
		}
	}
	return reqs, nil
}
