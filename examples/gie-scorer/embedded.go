package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization"
)

// Picker is where the scorer asks for a decision: the daemon over gRPC
// (*client.Client) or the index embedded in the picker's own process
// (InProcess). Both answer the same on the same events.
type Picker interface {
	Pick(ctx context.Context, r *client.Request) (*client.Decision, error)
}

// InProcess answers Pick with package indexer in this process: no daemon
// and no network hop, the router subscribes to the engines itself.
type InProcess struct {
	X *indexer.Indexer
}

var (
	_ Picker = (*client.Client)(nil)
	_ Picker = InProcess{}
)

// Pick is client.Client's Pick on the embedded index: a request the index
// cannot answer now (Unavailable, the context's deadline) falls back to the
// least loaded candidate; a malformed one, or one it cannot score with its
// configuration (no tokenizer), is an error.
func (p InProcess) Pick(ctx context.Context, r *client.Request) (*client.Decision, error) {
	if len(r.Candidates) == 0 {
		return nil, errors.New("in-process: no candidates")
	}
	q := indexer.PickQuery{Query: indexer.Query{Model: r.Model, LoraName: r.LoraName, CacheSalt: r.CacheSalt,
		AddSpecialTokens: r.AddSpecialTokens}, Policy: r.Policy, Candidates: make([]indexer.Candidate, len(r.Candidates))}
	switch {
	case len(r.TokenIDs) > 0:
		q.Kind, q.TokenIDs = indexer.InputTokens, r.TokenIDs
	case len(r.BlockHashes) > 0:
		q.Kind, q.BlockHashes = indexer.InputHashes, r.BlockHashes
	case r.Prompt != "":
		q.Kind, q.Prompt = indexer.InputPrompt, r.Prompt
	}
	for i, c := range r.Candidates {
		ic := &q.Candidates[i]
		ic.Pod, ic.Load = c.Pod, routing.Load{Waiting: c.Waiting, Running: c.Running, KVUsage: c.KVUsage}
		if c.DPRank != nil {
			ic.DPRank, ic.HasDPRank = *c.DPRank, true
		}
		if c.Events != nil {
			ic.Events = indexer.EventsOff
			if *c.Events {
				ic.Events = indexer.EventsOn
			}
		}
	}
	var res indexer.PickResult
	if err := p.X.Pick(ctx, &q, &res); err != nil {
		var ie *indexer.Error
		if errors.As(err, &ie) && (ie.Code == indexer.InvalidArgument || ie.Code == indexer.FailedPrecondition) {
			return nil, fmt.Errorf("in-process: pick: %w", err)
		}
		return client.Fallback(r, err), nil
	}
	d := &client.Decision{Index: res.Chosen, Pod: res.Pod, Policy: res.Policy, Reason: res.Reason.String(),
		Candidates: make([]client.CandidateResult, len(res.Candidates))}
	if res.HasDPRank {
		v := res.DPRank
		d.DPRank = &v
	}
	for i, c := range res.Candidates {
		d.Candidates[i] = client.CandidateResult{Pod: c.Pod, MatchedBlocks: c.MatchedBlocks,
			SpeculativeBlocks: c.SpeculativeBlocks, Approximate: c.Approximate, Score: c.Score, Cost: c.Cost}
	}
	return d, nil
}

// embeddedConfig is the -embedded mode's flags.
type embeddedConfig struct {
	engines   []string // tcp://host:port[,pod=NAME]
	bind      string
	model     string
	tokenizer string
	hashSeed  string
	blockSize int
}

// startEmbedded builds the index, subscribes to the engines and runs it
// until ctx ends; stop waits for it and releases it.
func startEmbedded(ctx context.Context, cfg embeddedConfig) (x *indexer.Indexer, stop func(), err error) {
	ev := &kvevents.Config{Bind: cfg.bind}
	for _, e := range cfg.engines {
		addr, opts, _ := strings.Cut(e, ",")
		ep := kvevents.EndpointConfig{Address: addr, Model: cfg.model}
		if opts != "" {
			pod, ok := strings.CutPrefix(opts, "pod=")
			if !ok {
				return nil, nil, fmt.Errorf("-engine %q: want tcp://host:port[,pod=NAME]", e)
			}
			ep.Pod = pod
		}
		ev.Endpoints = append(ev.Endpoints, ep)
	}
	c := indexer.Config{Keys: blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: cfg.hashSeed, BlockSize: cfg.blockSize}, Events: ev}
	if cfg.tokenizer != "" {
		reg := tokenization.NewRegistry(tokenization.RegistryConfig{Models: map[string]string{cfg.model: cfg.tokenizer}})
		c.Tokenizer = prefixstore.New(prefixstore.Config{}, reg, nil)
	}
	ctx, cancel := context.WithCancel(ctx)
	if x, err = indexer.New(ctx, c); err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	return x, func() {
		cancel()
		<-done
		_ = x.Close()
	}, nil
}

// settle waits d for the engines' events to arrive (an embedded index
// starts empty; a long-running router has no such wait).
func settle(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
