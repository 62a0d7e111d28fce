// Package llmdproducer is an llm-d-router data producer with the contract
// of llm-d's precise-prefix-cache-producer whose match data comes from
// kvindexd: it consumes the token-producer's TokenizedPrompt, writes each
// candidate endpoint's PrefixCacheMatchInfo (tier-weighted match, cached
// block count and per-tier breakdown, the numbers upstream computes on the
// same events) under its instance name, and with speculativeIndexing
// records speculative entries for the scheduler's chosen endpoint(s) in
// PreRequest, as upstream does (speculative.go), and has the daemon hold
// them too. The generic
// prefix-cache-scorer, the P/D decider and the other consumers read it
// through prefixMatchInfoProducerName as they read the upstream producer.
//
// The daemon owns the index, the block hashing and the engines' KV-event
// subscriptions, so the picker process holds no index, only its record of
// speculative entries: Produce is one Score call per prompt (two when
// speculative entries cover part of an endpoint's run; no side effect),
// PreRequest one Pick per chosen endpoint and prompt (a Pick holds the
// request's blocks for the pod it returns).
//
// It compiles against mirror/, a copy of the framework's interface surface
// (see package mirror for the upstream commit and paths); with the real
// module, swap the imports.
package llmdproducer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/prefix"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/requestcontrol"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/requesthandling"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/scheduling"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/tokenizer"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// PluginType is the type name an EndpointPickerConfig refers to.
const PluginType = "kvindex-prefix-cache-producer"

// Defaults of Config.
const (
	// DefaultAddr is the sidecar socket docs/operations.md describes.
	DefaultAddr = "unix:///run/kvindex/grpc.sock"
	// DefaultBlockSize is kvindexd's --block-size default.
	DefaultBlockSize = 16
	// DefaultMaxPending bounds the requests between Produce and PreRequest.
	DefaultMaxPending = 10000
	// pendingTTL: a request not handed to PreRequest by then (rejected,
	// failed scheduling) is dropped from the pending state.
	pendingTTL = time.Minute
	// prefillProfile is the P/D prefill profile's name upstream seeds too.
	prefillProfile = "prefill"
)

// Config is the plugin's parameters (JSON, unknown fields are errors, as
// the framework's strict decoder makes them).
type Config struct {
	// KVIndexAddr is kvindexd's gRPC address: host:port or unix:///path.
	KVIndexAddr string `json:"kvindexAddr"`
	// Timeout bounds one call to the daemon (Go duration; "" = the
	// client's 50ms default).
	Timeout string `json:"timeout"`
	// BlockSize is the daemon's block size for the models routed (its
	// --block-size); a daemon answer in other blocks is an error.
	BlockSize int `json:"blockSize"`
	// PodIdentifier says how an endpoint is named to the daemon: the name
	// its engine publishes KV events under. "address:port" (the default,
	// the identity llm-d's own index keys pods by) or "name" (the
	// endpoint's metadata name, the pod name).
	PodIdentifier string `json:"podIdentifier"`
	// SpeculativeIndexing: after a routing decision the producer records
	// that the chosen endpoint(s) hold the request's blocks, for
	// SpeculativeTTL, and reports them under the "speculative" tier as
	// upstream does; the daemon holds them too (for its --speculative-ttl),
	// so its own Picks see them.
	SpeculativeIndexing bool `json:"speculativeIndexing"`
	// SpeculativeTTL is how long a speculative entry lives (Go duration;
	// "" or not positive = 2s, as upstream).
	SpeculativeTTL string `json:"speculativeTTL"`
	// MaxSpeculativeEntries caps the recorded (block, endpoint) entries.
	MaxSpeculativeEntries int `json:"maxSpeculativeEntries"`
	// MaxPending caps the requests waiting between Produce and PreRequest.
	MaxPending int `json:"maxPending"`
}

// Producer is the plugin. Safe for concurrent use.
type Producer struct {
	name      string
	dk        plugin.DataKey
	cfg       Config
	scorer    kvindexv1.IndexerClient
	conn      *grpc.ClientConn
	picker    *client.Client
	timeout   time.Duration
	log       *slog.Logger
	spec      *specRecord // nil without SpeculativeIndexing
	mu        sync.Mutex
	pending   map[string]pendingRequest
	dropped   uint64 // pending state refused at the cap
	holds     uint64 // Picks that held speculative entries
	holdFails uint64
}

// pendingRequest is what PreRequest needs of a produced request.
type pendingRequest struct {
	model  string
	salt   string
	prompt [][]uint32
	keys   [][]uint64 // per prompt, specRecord's keys of its scored blocks
	at     time.Time
}

var (
	_ requestcontrol.DataProducer = (*Producer)(nil)
	_ requestcontrol.PreRequest   = (*Producer)(nil)
	_ plugin.ConsumerPlugin       = (*Producer)(nil)
	_ plugin.StateDumper          = (*Producer)(nil)
)

// Register adds the plugin type to the framework's registry.
func Register() { plugin.Register(PluginType, plugin.StabilityAlpha, PluginFactory) }

// PluginFactory is the plugin.FactoryFunc: it decodes the parameters and
// builds the producer; its connections close when the handle's context ends.
func PluginFactory(name string, params *json.Decoder, handle plugin.Handle) (plugin.Plugin, error) {
	var cfg Config
	if params != nil {
		if err := params.Decode(&cfg); err != nil {
			return nil, fmt.Errorf("failed to parse %s plugin config: %w", PluginType, err)
		}
	}
	p, err := New(name, cfg, slog.Default())
	if err != nil {
		return nil, fmt.Errorf("failed to create %s plugin: %w", PluginType, err)
	}
	go func() {
		<-handle.Context().Done()
		_ = p.Close()
	}()
	return p, nil
}

// New validates cfg, fills its defaults and creates the daemon's clients
// (they connect on first use).
func New(name string, cfg Config, log *slog.Logger) (*Producer, error) {
	if cfg.KVIndexAddr == "" {
		cfg.KVIndexAddr = DefaultAddr
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.BlockSize < 0 {
		return nil, fmt.Errorf("blockSize %d is negative", cfg.BlockSize)
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.MaxPending < 0 {
		return nil, fmt.Errorf("maxPending %d is negative", cfg.MaxPending)
	}
	switch cfg.PodIdentifier {
	case "":
		cfg.PodIdentifier = "address:port"
	case "address:port", "name":
	default:
		return nil, fmt.Errorf("podIdentifier %q: want \"address:port\" or \"name\"", cfg.PodIdentifier)
	}
	if cfg.MaxSpeculativeEntries == 0 {
		cfg.MaxSpeculativeEntries = DefaultMaxSpeculativeEntries
	}
	if cfg.MaxSpeculativeEntries < 0 {
		return nil, fmt.Errorf("maxSpeculativeEntries %d is negative", cfg.MaxSpeculativeEntries)
	}
	specTTL := DefaultSpeculativeTTL
	if cfg.SpeculativeTTL != "" {
		// upstream: a parse error is an error, a non-positive one the default
		d, err := time.ParseDuration(cfg.SpeculativeTTL)
		if err != nil {
			return nil, fmt.Errorf("invalid speculativeTTL %q: %w", cfg.SpeculativeTTL, err)
		}
		if d > 0 {
			specTTL = d
		}
	}
	var timeout time.Duration
	if cfg.Timeout != "" {
		d, err := time.ParseDuration(cfg.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("timeout %q: want a positive Go duration", cfg.Timeout)
		}
		timeout = d
	}
	picker, err := client.New(client.Config{Addr: cfg.KVIndexAddr, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	// The client package answers Pick only; Score goes through the
	// generated stub on a connection of its own.
	conn, err := grpc.NewClient(cfg.KVIndexAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		_ = picker.Close()
		return nil, err
	}
	if timeout == 0 {
		timeout = client.DefaultTimeout
	}
	p := &Producer{name: name, dk: prefix.PrefixCacheMatchInfoDataKey.WithNonEmptyProducerName(name),
		cfg: cfg, scorer: kvindexv1.NewIndexerClient(conn), conn: conn, picker: picker, timeout: timeout,
		log: log, pending: map[string]pendingRequest{}}
	if cfg.SpeculativeIndexing {
		p.spec = newSpecRecord(specTTL, cfg.MaxSpeculativeEntries, rand.Uint64())
	}
	return p, nil
}

// Close releases the daemon connections.
func (p *Producer) Close() error {
	return errors.Join(p.picker.Close(), p.conn.Close())
}

// TypedName is the plugin's type and instance name.
func (p *Producer) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: PluginType, Name: p.name}
}

// Produces: PrefixCacheMatchInfo bound to this instance's name, which the
// consumers' prefixMatchInfoProducerName selects.
func (p *Producer) Produces() map[plugin.DataKey]any {
	return map[plugin.DataKey]any{p.dk: prefix.PrefixCacheMatchInfo{}}
}

// Consumes: the token-producer's TokenizedPrompt, so the framework runs
// tokenization first.
func (p *Producer) Consumes() plugin.DataDependencies {
	return plugin.DataDependencies{Required: map[plugin.DataKey]any{
		tokenizer.TokenizedPromptDataKey: scheduling.TokenizedRequest{}}}
}

// podID names ep to the daemon ("" = no metadata: skipped, as upstream).
func (p *Producer) podID(ep scheduling.Endpoint) string {
	md := ep.GetMetadata()
	if md == nil {
		return ""
	}
	if p.cfg.PodIdentifier == "name" {
		if md.Name != "" {
			return md.Name
		}
		return md.ID.Name
	}
	return md.Address + ":" + md.Port
}

// match is one endpoint's numbers summed over the request's prompts.
type match struct {
	weighted float64
	blocks   int
	tiers    map[string]int
}

// Produce writes every candidate's PrefixCacheMatchInfo from the daemon's
// Score of the request's tokens and, with speculativeIndexing, the
// producer's speculative record. A request without tokens is a no-op; an
// unreachable daemon or a refused request is an error (the framework then
// runs without this data, as with the upstream producer's lookup errors).
func (p *Producer) Produce(ctx context.Context, req *scheduling.InferenceRequest, endpoints []scheduling.Endpoint) error {
	prompts, salt := tokenizedPrompts(req)
	if len(prompts) == 0 {
		return nil
	}
	pods := make([]string, 0, len(endpoints))
	for _, ep := range endpoints {
		if id := p.podID(ep); id != "" {
			pods = append(pods, id)
		}
	}
	matches := map[string]*match{}
	total, mm := 0, false
	var keys [][]uint64
	for _, pr := range prompts {
		tokens := pr.TokenIDs
		total += len(tokens) / p.cfg.BlockSize
		if len(pr.MultiModalFeatures) > 0 {
			// The blocks from the first media item on carry its hash, which
			// token ids alone do not give: score the prefix before it.
			mm = true
			tokens = tokens[:firstMedia(pr, len(tokens))]
		}
		var pk []uint64
		if p.spec != nil {
			pk = p.spec.keys(nil, req.TargetModel, salt, tokens, p.cfg.BlockSize)
			keys = append(keys, pk)
		}
		if len(tokens) < p.cfg.BlockSize {
			continue
		}
		if err := p.score(ctx, req.TargetModel, salt, tokens, pods, pk, matches); err != nil {
			return err
		}
	}
	for _, ep := range endpoints {
		id := p.podID(ep)
		if id == "" {
			continue
		}
		m := matches[id]
		if m == nil {
			m = &match{tiers: map[string]int{}}
		}
		info := prefix.NewPrefixCacheMatchInfo(int(m.weighted), total, p.cfg.BlockSize).
			WithCachedBlockCount(m.blocks).WithCachedBlocksByTier(m.tiers)
		if mm {
			// The match stops before the first media block, so it covers
			// none of them.
			info.WithMM(prefix.MMMatchInfo{})
		}
		ep.Put(p.dk, info)
	}
	if p.cfg.SpeculativeIndexing && req.RequestID != "" {
		toks := make([][]uint32, len(prompts))
		for i, pr := range prompts {
			toks[i] = pr.TokenIDs
		}
		p.remember(req.RequestID, pendingRequest{model: req.TargetModel, salt: salt, prompt: toks, keys: keys, at: time.Now()})
	}
	return nil
}

// score adds one prompt's numbers to matches: the daemon's Score and, for
// endpoints with speculative entries (keys: the prompt's specRecord keys,
// nil without speculativeIndexing), those entries as upstream's Produce
// counts them. Upstream walks each block's entries; per endpoint, with a
// the daemon's run and b the speculative run from block 0, that gives:
//
//   - the speculative tier: b (matchedBlockCountByTier); the other tiers
//     are the daemon's tier_runs, the same function's count of them;
//   - cached blocks: max(a, b) (matchedBlockCount counts a block held on
//     any tier, speculative included);
//   - the weighted match: weight 1 on each of blocks 0..b-1 (a speculative
//     entry weighs 1, no tier weight is above 1 by default, and the scorer
//     takes a block's best weight), and the confirmed weights of blocks
//     b..a-1: the daemon's score less its score of the first b blocks, one
//     more Score call, made only when 0 < b < a.
func (p *Producer) score(ctx context.Context, model, salt string, tokens []uint32, pods []string, keys []uint64, matches map[string]*match) error {
	resp, err := p.scoreOnce(ctx, model, salt, tokens, pods)
	if err != nil {
		return err
	}
	confirmed := map[string]*kvindexv1.PodScore{}
	for _, ps := range resp.GetPods() {
		confirmed[ps.GetPod()] = ps
	}
	spec := map[string]int{}
	if keys != nil {
		for _, pod := range pods {
			if b := p.spec.run(pod, keys); b > 0 {
				spec[pod] = b
			}
		}
	}
	// weighted score of blocks 0..b-1, for the endpoints with 0 < b < a
	head := map[string]float64{}
	byRun := map[int][]string{}
	for pod, b := range spec {
		if b < int(confirmed[pod].GetMatchedBlocks()) {
			byRun[b] = append(byRun[b], pod)
		}
	}
	for b, group := range byRun {
		r, err := p.scoreOnce(ctx, model, salt, tokens[:b*p.cfg.BlockSize], group)
		if err != nil {
			return err
		}
		for _, ps := range r.GetPods() {
			head[ps.GetPod()] = ps.GetScore()
		}
	}
	for _, pod := range pods {
		ps, b := confirmed[pod], spec[pod]
		if ps == nil && b == 0 {
			continue
		}
		m := matches[pod]
		if m == nil {
			m = &match{tiers: map[string]int{}}
			matches[pod] = m
		}
		a := int(ps.GetMatchedBlocks())
		m.blocks += max(a, b)
		addTiers(m.tiers, ps.GetTierRuns())
		switch {
		case b == 0:
			m.weighted += ps.GetScore()
		case b >= a:
			m.weighted += float64(b)
		default:
			m.weighted += float64(b) + ps.GetScore() - head[pod]
		}
		if b > 0 {
			m.tiers[prefix.SpeculativeTierKey] += b
		}
	}
	return nil
}

// scoreOnce is one Score call, its block size checked.
func (p *Producer) scoreOnce(ctx context.Context, model, salt string, tokens []uint32, pods []string) (*kvindexv1.ScoreResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.scorer.Score(ctx, &kvindexv1.ScoreRequest{Model: model, CacheSalt: salt, Pods: pods,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Packed: kvindexv1.PackTokenIDs(tokens)}}})
	if err != nil {
		return nil, fmt.Errorf("kvindex score: %w", err)
	}
	for _, ps := range resp.GetPods() {
		if n := ps.GetMatchedBlocks(); n > 0 && ps.GetMatchedTokens() != int64(n)*int64(p.cfg.BlockSize) {
			return nil, fmt.Errorf("kvindex indexes model %q in blocks of %d tokens, blockSize is %d",
				model, ps.GetMatchedTokens()/int64(n), p.cfg.BlockSize)
		}
	}
	return resp, nil
}

// addTiers adds the daemon's per-tier counts under llm-d's lower-case
// device-tier names, leaving out empty tiers.
func addTiers(dst map[string]int, t *kvindexv1.TierCounts) {
	for _, kv := range []struct {
		name string
		n    int32
	}{{"gpu", t.GetGpu()}, {"cpu", t.GetCpu()}, {"disk", t.GetDisk()}, {"external", t.GetExternal()}, {"shared", t.GetShared()}} {
		if kv.n > 0 {
			dst[kv.name] += int(kv.n)
		}
	}
}

// PreRequest has the daemon hold the request's blocks for the primary
// profile's chosen endpoint and, with a "prefill" profile (P/D), for the
// prefill endpoint too: a Pick offering only that endpoint. A failed hold
// is logged and counted, never fails the request (as upstream).
func (p *Producer) PreRequest(ctx context.Context, req *scheduling.InferenceRequest, res *scheduling.SchedulingResult) error {
	if !p.cfg.SpeculativeIndexing || req == nil || res == nil {
		return nil
	}
	pr, ok := p.take(req.RequestID)
	if !ok {
		return nil
	}
	targets := []string{}
	for _, profile := range []string{res.PrimaryProfileName, prefillProfile} {
		r := res.ProfileResults[profile]
		id := ""
		if r != nil && len(r.TargetEndpoints) > 0 {
			id = p.podID(r.TargetEndpoints[0])
		}
		if id == "" {
			if profile == res.PrimaryProfileName {
				return nil // upstream seeds nothing, prefill included, without a primary target
			}
			continue
		}
		targets = append(targets, id)
	}
	// The producer's own record, which Produce reports (as upstream's
	// index entries): for the same endpoints, with the keys Produce used.
	for _, pod := range targets {
		for _, k := range pr.keys {
			if len(k) > 0 {
				p.spec.record(pod, k)
			}
		}
	}
	// Events on: the daemon holds the blocks speculatively (as upstream's
	// index does) even for an endpoint it has no events from yet, rather
	// than in its routing history for pods without events.
	eventsOn := true
	for _, pod := range targets {
		for _, toks := range pr.prompt {
			d, err := p.picker.Pick(ctx, &client.Request{Model: pr.model, CacheSalt: pr.salt, TokenIDs: toks,
				Candidates: []client.Candidate{{Pod: pod, Events: &eventsOn}}})
			p.mu.Lock()
			if err != nil || d.Fallback {
				p.holdFails++
			} else {
				p.holds++
			}
			p.mu.Unlock()
			if err == nil && d.Fallback {
				err = d.Err
			}
			if err != nil {
				p.log.Warn("kvindex speculative hold failed", "request", req.RequestID, "pod", pod, "err", err)
			}
		}
	}
	return nil
}

// remember keeps a produced request for PreRequest, within MaxPending:
// stale entries are swept when the map is full, and a request past the
// cap is not held speculatively (counted in DumpState's droppedPending).
func (p *Producer) remember(id string, pr pendingRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pending[id]; !ok && len(p.pending) >= p.cfg.MaxPending {
		for k, v := range p.pending {
			if pr.at.Sub(v.at) > pendingTTL {
				delete(p.pending, k)
			}
		}
		if len(p.pending) >= p.cfg.MaxPending {
			p.dropped++
			return
		}
	}
	p.pending[id] = pr
}

// take removes and returns a request's pending state.
func (p *Producer) take(id string) (pendingRequest, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.pending[id]
	delete(p.pending, id)
	return pr, ok
}

// State is what DumpState reports.
type State struct {
	KVIndexAddr         string `json:"kvindexAddr"`
	SpeculativeIndexing bool   `json:"speculativeIndexing"`
	BlockSizeTokens     int    `json:"blockSizeTokens"`
	Pending             int    `json:"pending"`
	MaxPending          int    `json:"maxPending"`
	DroppedPending      uint64 `json:"droppedPending"`
	Holds               uint64 `json:"holds"`
	HoldFailures        uint64 `json:"holdFailures"`
	// The speculative record: (block, endpoint) entries held (expired ones
	// until swept at the cap), the cap, and entries dropped at the cap.
	SpeculativeEntries    int    `json:"speculativeEntries"`
	MaxSpeculativeEntries int    `json:"maxSpeculativeEntries"`
	DroppedSpeculative    uint64 `json:"droppedSpeculative"`
}

// Stats returns the producer's counters.
func (p *Producer) Stats() State {
	var entries int
	var dropped uint64
	if p.spec != nil {
		entries, dropped = p.spec.stats()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return State{KVIndexAddr: p.cfg.KVIndexAddr, SpeculativeIndexing: p.cfg.SpeculativeIndexing,
		BlockSizeTokens: p.cfg.BlockSize, Pending: len(p.pending), MaxPending: p.cfg.MaxPending,
		DroppedPending: p.dropped, Holds: p.holds, HoldFailures: p.holdFails,
		SpeculativeEntries: entries, MaxSpeculativeEntries: p.cfg.MaxSpeculativeEntries, DroppedSpeculative: dropped}
}

// DumpState implements plugin.StateDumper: counters only, no prompts.
func (p *Producer) DumpState() (json.RawMessage, error) { return json.Marshal(p.Stats()) }

type promptTokens = requesthandling.PromptTokens

// tokenizedPrompts returns the request's non-empty prompts and cache salt.
func tokenizedPrompts(req *scheduling.InferenceRequest) ([]promptTokens, string) {
	if req == nil || req.Body == nil || req.Body.TokenizedRequest == nil {
		return nil, ""
	}
	tr := req.Body.TokenizedRequest
	var out []promptTokens
	for _, pr := range tr.Prompts {
		if len(pr.TokenIDs) > 0 {
			out = append(out, pr)
		}
	}
	return out, tr.CacheSalt
}

// firstMedia is the token offset of the prompt's first multimodal item
// (n when it has none inside the prompt).
func firstMedia(pr promptTokens, n int) int {
	offs := make([]int, 0, len(pr.MultiModalFeatures))
	for _, f := range pr.MultiModalFeatures {
		offs = append(offs, f.Offset)
	}
	sort.Ints(offs)
	switch {
	case len(offs) == 0 || offs[0] >= n:
		return n
	case offs[0] < 0: // a malformed offset: no prefix is known to be media-free
		return 0
	}
	return offs[0]
}
