package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Scenario is a `kvsim simulate --scenario FILE.yaml` file: a fleet of
// vLLM pods, a staged load, a workload shape and the schedulers to compare.
// The keys follow the benchmark harness the published results used
// (inference-perf's load/data sections) so a published run can be restated
// as a scenario. docs/simulator.md documents every key and its default.
type Scenario struct {
	Name           string  `yaml:"name"`
	Seed           uint64  `yaml:"seed"`
	Pods           int     `yaml:"pods"`
	KVTokensPerPod int     `yaml:"kv_tokens_per_pod"`
	BlockSize      int     `yaml:"block_size"`
	KVEventLag     float64 `yaml:"kv_event_lag_s"`     // pod step end -> precise index applies its events
	MetricsPeriod  float64 `yaml:"metrics_interval_s"` // scheduler's view of queue/KV usage is refreshed this often (0: live)
	// RouterReplicas runs every scheduler as that many independent
	// endpoint-picker replicas (replicatedScheduler); 1, the default, is one
	// picker, as every deployment file of the published runs has.
	RouterReplicas int             `yaml:"router_replicas"`
	Engine         engineSpec      `yaml:"engine"`
	Load           loadSpec        `yaml:"load"`
	Data           dataSpec        `yaml:"data"`
	Client         clientSpec      `yaml:"client"`
	Schedulers     []schedulerSpec `yaml:"schedulers"`
}

// clientSpec is the `client:` section: how the load generator sends the
// requests and how results are measured (docs/simulator.md, "Client model").
//
// open (the default): every request is sent at its arrival time, stages
// follow each other on the clock, and throughput is what the fleet delivered
// inside each stage's window.
//
// inference-perf: the harness of the published llm-d runs. Each stage sends
// int(rate x duration) requests and then waits until all of them have
// finished before the next stage starts (StageGap later), so a stage starts
// on an idle fleet with a warm cache; a stage's output tokens/s are its
// successful requests' tokens over the span from its first send to its last
// response, and its requests/s are its requests over its send span.
type clientSpec struct {
	Type string `yaml:"type"` // open | inference-perf
	// StageGap is the idle time between a stage's last response and the
	// next stage's first scheduled send (inference-perf: load.interval 1 s
	// plus the 1 s lead it gives its workers).
	StageGap float64 `yaml:"stage_gap_s"`
	// MaxConcurrency bounds the requests outstanding at once (0: no bound);
	// a request that finds every slot taken waits in the client, and its
	// TTFT counts from when it is actually sent, as inference-perf measures.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Timeout is the client's total request timeout (0: none); a request
	// that has not finished by then fails (it is left out of the latency and
	// token figures) and the pod aborts it.
	Timeout float64 `yaml:"timeout_s"`
	// RequestOverhead is fixed time between the client sending a request
	// and the endpoint picker seeing it (gateway, HTTP, tokenisation). It is
	// part of the TTFT.
	RequestOverhead float64 `yaml:"request_overhead_s"`
	// RequestOverheadExp adds an exponentially distributed part with this
	// mean to each request's overhead (0: none). The published precise
	// TTFTs have a p90 well above their mean even at the lowest load, where
	// the engine adds almost nothing: the path in front of the picker
	// varies per request, and a constant cannot give that spread.
	RequestOverheadExp float64 `yaml:"request_overhead_exp_s"`
	// GatewayMaxActive bounds the requests in flight through the gateway
	// at once (0: no bound). A request sent while that many are active is
	// rejected at once (an HTTP 503, as an Envoy circuit breaker's overflow
	// answers): it fails with no tokens and no TTFT, and never reaches a pod.
	// Unlike MaxConcurrency, nothing waits.
	GatewayMaxActive int `yaml:"gateway_max_active"`
}

// drains reports whether stages wait for their requests (inference-perf).
func (c clientSpec) drains() bool { return c.Type == "inference-perf" }

// engineSpec is the `engine:` section (EngineConfig without the KV sizing).
type engineSpec struct {
	PrefillTokensPerS   float64 `yaml:"prefill_tokens_per_s"`
	DecodeITL           float64 `yaml:"decode_itl_s"`
	DecodePerSeq        float64 `yaml:"decode_per_seq_s"`
	DecodePerKVToken    float64 `yaml:"decode_per_kv_token_s"`
	SharedKVReadOnce    bool    `yaml:"shared_kv_read_once"`
	SharedKVReadShare   float64 `yaml:"shared_kv_read_share"`
	MaxNumSeqs          int     `yaml:"max_num_seqs"`
	MaxNumBatchedTokens int     `yaml:"max_num_batched_tokens"`
}

// defaultEngineSpec is an H100-class pod serving Qwen3-32B in BF16 with
// tensor parallelism 2; the derivation of each number is in docs/simulator.md.
func defaultEngineSpec() engineSpec {
	return engineSpec{PrefillTokensPerS: 16000, DecodeITL: 0.017, DecodePerSeq: 55e-6, DecodePerKVToken: 52e-9,
		MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192}
}

// loadSpec is the `load:` section: consecutive stages of Poisson or evenly
// spaced ("constant") arrivals. The first WarmupStages stages are simulated
// but left out of the summary, as the published summaries leave out theirs.
type loadSpec struct {
	Type         string      `yaml:"type"`
	WarmupStages int         `yaml:"warmup_stages"`
	Stages       []stageSpec `yaml:"stages"`
}

// stageSpec is one load stage.
type stageSpec struct {
	Rate     float64 `yaml:"rate"`     // requests per second
	Duration float64 `yaml:"duration"` // seconds
}

// dataSpec is the `data:` section. shared_prefix: NumGroups system prompts
// of SystemPromptLen tokens, each followed by NumPromptsPerGroup distinct
// questions of QuestionLen tokens; every request generates OutputLen tokens
// (ignore_eos). Requests cycle through the prompts in one seeded random
// order, as inference-perf's shared-prefix generator does.
type dataSpec struct {
	Type               string `yaml:"type"`
	NumGroups          int    `yaml:"num_groups"`
	NumPromptsPerGroup int    `yaml:"num_prompts_per_group"`
	SystemPromptLen    int    `yaml:"system_prompt_len"`
	QuestionLen        int    `yaml:"question_len"`
	OutputLen          int    `yaml:"output_len"`
}

// MaxRouterReplicas bounds router_replicas: each replica of an approximate
// scorer holds its own index of up to lru_capacity_per_server entries per pod.
const MaxRouterReplicas = 64

// Scenario size bounds: the simulator allocates per pod, block and request.
const (
	maxScenarioRequests = 2_000_000
	maxScenarioBlocks   = 1 << 24 // pods x blocks per pod: the engines allocate them up front (~40 bytes each)
	maxPromptTokens     = 1 << 22
)

// parseScenario reads and validates a scenario; unknown keys are errors (a
// misspelt key must not silently fall back to a default).
func parseScenario(r io.Reader) (*Scenario, error) {
	b, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, errors.New("scenario: file larger than 1 MiB")
	}
	sc := &Scenario{Seed: 1, RouterReplicas: 1, KVEventLag: 0.05, MetricsPeriod: 0.05, Engine: defaultEngineSpec(),
		Load: loadSpec{Type: "poisson"}, Data: dataSpec{Type: "shared_prefix"}, Client: clientSpec{Type: "open", StageGap: 2}}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(sc); err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	if err := sc.validate(); err != nil {
		return nil, err
	}
	return sc, nil
}

// ReadScenarioFile opens and parses path.
func ReadScenarioFile(path string) (*Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseScenario(f)
}

func finiteNonNeg(x float64) bool { return x >= 0 && !math.IsInf(x, 0) }

// validate checks every field; the error names the key.
func (sc *Scenario) validate() error {
	switch {
	case sc.Pods < 1 || sc.Pods > MaxPods:
		return fmt.Errorf("scenario: pods must be in [1, %d]", MaxPods)
	case sc.BlockSize < 1 || sc.BlockSize > 1<<16:
		return errors.New("scenario: block_size must be in [1, 65536]")
	case sc.KVTokensPerPod < sc.BlockSize:
		return errors.New("scenario: kv_tokens_per_pod must hold at least one block")
	case int64(sc.Pods)*int64(sc.KVTokensPerPod/sc.BlockSize) > maxScenarioBlocks:
		return fmt.Errorf("scenario: pods x kv blocks exceeds %d", maxScenarioBlocks)
	case !finiteNonNeg(sc.KVEventLag) || !finiteNonNeg(sc.MetricsPeriod):
		return errors.New("scenario: kv_event_lag_s and metrics_interval_s must be finite and >= 0")
	case sc.RouterReplicas < 1 || sc.RouterReplicas > MaxRouterReplicas:
		return fmt.Errorf("scenario: router_replicas must be in [1, %d]", MaxRouterReplicas)
	}
	if err := sc.engineConfig().validate(); err != nil {
		return fmt.Errorf("scenario: %w", err)
	}
	if sc.Load.Type != "poisson" && sc.Load.Type != "constant" {
		return fmt.Errorf("scenario: load.type %q: want poisson or constant", sc.Load.Type)
	}
	if len(sc.Load.Stages) == 0 {
		return errors.New("scenario: load.stages is empty")
	}
	if sc.Load.WarmupStages < 0 || sc.Load.WarmupStages >= len(sc.Load.Stages) {
		return errors.New("scenario: load.warmup_stages must leave at least one measured stage")
	}
	total := 0.0
	for i, st := range sc.Load.Stages {
		if !(st.Rate > 0) || !(st.Duration > 0) || math.IsInf(st.Rate, 0) || math.IsInf(st.Duration, 0) {
			return fmt.Errorf("scenario: load.stages[%d]: rate and duration must be positive and finite", i)
		}
		total += st.Rate * st.Duration
	}
	if total > maxScenarioRequests {
		return fmt.Errorf("scenario: load asks for about %.0f requests, more than %d", total, maxScenarioRequests)
	}
	c := sc.Client
	switch {
	case c.Type != "open" && c.Type != "inference-perf":
		return fmt.Errorf("scenario: client.type %q: want open or inference-perf", c.Type)
	case !finiteNonNeg(c.StageGap) || !finiteNonNeg(c.Timeout) || !finiteNonNeg(c.RequestOverhead) ||
		!finiteNonNeg(c.RequestOverheadExp):
		return errors.New("scenario: client.stage_gap_s, timeout_s, request_overhead_s and request_overhead_exp_s must be finite and >= 0")
	case c.MaxConcurrency < 0:
		return errors.New("scenario: client.max_concurrency must be >= 0 (0: unbounded)")
	case c.GatewayMaxActive < 0:
		return errors.New("scenario: client.gateway_max_active must be >= 0 (0: unbounded)")
	case c.Timeout > 0 && c.Timeout <= c.RequestOverhead:
		return errors.New("scenario: client.timeout_s must exceed request_overhead_s")
	}
	d := sc.Data
	if d.Type != "shared_prefix" {
		return fmt.Errorf("scenario: data.type %q: only shared_prefix is supported", d.Type)
	}
	if d.NumGroups < 1 || d.NumPromptsPerGroup < 1 || d.SystemPromptLen < 0 || d.QuestionLen < 0 || d.OutputLen < 1 ||
		d.SystemPromptLen+d.QuestionLen < 1 || d.SystemPromptLen+d.QuestionLen > maxPromptTokens ||
		int64(d.NumGroups)*int64(d.NumPromptsPerGroup) > maxScenarioRequests {
		return errors.New("scenario: data needs num_groups, num_prompts_per_group, output_len >= 1 and a prompt of 1.." +
			fmt.Sprint(maxPromptTokens) + " tokens")
	}
	if need := (d.SystemPromptLen + d.QuestionLen + d.OutputLen + sc.BlockSize - 1) / sc.BlockSize; need > sc.KVTokensPerPod/sc.BlockSize {
		return fmt.Errorf("scenario: one request needs %d blocks, more than a pod's %d", need, sc.KVTokensPerPod/sc.BlockSize)
	}
	if len(sc.Schedulers) == 0 {
		return errors.New("scenario: schedulers is empty")
	}
	seen := map[string]bool{}
	for i := range sc.Schedulers {
		if _, err := sc.Schedulers[i].resolve(); err != nil {
			return fmt.Errorf("scenario: schedulers[%d]: %w", i, err)
		}
		n := sc.Schedulers[i].Name
		if seen[n] {
			return fmt.Errorf("scenario: scheduler name %q used twice", n)
		}
		seen[n] = true
	}
	return nil
}

func (sc *Scenario) engineConfig() engineConfig {
	e := sc.Engine
	return engineConfig{KVBlocks: sc.KVTokensPerPod / max(sc.BlockSize, 1), BlockSize: sc.BlockSize, MaxNumSeqs: e.MaxNumSeqs,
		MaxNumBatchedTokens: e.MaxNumBatchedTokens, PrefillTokensPerS: e.PrefillTokensPerS, DecodeITL: e.DecodeITL,
		DecodePerSeq: e.DecodePerSeq, DecodePerKVToken: e.DecodePerKVToken, SharedKVReadOnce: e.SharedKVReadOnce,
		SharedKVReadShare: e.SharedKVReadShare}
}

// prompt is one distinct prompt of a shared-prefix workload: a group's
// system prompt followed by one of its questions. Its block hashes at any
// block size are derived from (group, question, position), so equal hashes
// mean equal token prefixes, at the engine's block size and at a router's.
type prompt struct {
	ID, Group, Question int
	SystemLen, Len      int
}

// hashes returns the hashes of the prompt's first min(full blocks, limit)
// blocks of blockSize tokens (limit <= 0: all full blocks). A block lying
// wholly inside the system prompt is the group's; any later block is the
// question's.
func (p *prompt) hashes(blockSize, limit int) []uint64 {
	n := p.Len / blockSize
	if limit > 0 {
		n = min(n, limit)
	}
	out := make([]uint64, n)
	for k := range out {
		key := uint64(p.Group)<<1 | 1
		if (k+1)*blockSize > p.SystemLen {
			key = uint64(p.ID) << 1
		}
		out[k] = mix64(mix64(key^0x9e3779b97f4a7c15) ^ uint64(blockSize)<<32 ^ uint64(k))
	}
	return out
}

// scenarioRequest is one generated request.
type scenarioRequest struct {
	Arrival   float64
	Stage     int
	Prompt    *prompt
	OutputLen int
}

// workload is a scenario's generated prompts and requests (arrival order).
type workload struct {
	Prompts  []prompt
	Requests []scenarioRequest
	// StageStart[i] is when stage i begins.
	StageStart []float64
}

// generateWorkload builds the scenario's requests, deterministically from
// its seed: stage by stage, Poisson (exponential gaps) or constant (evenly
// spaced) arrivals; order is one seeded shuffle of all (group, question)
// prompts. With inference-perf's client request n of every stage uses
// prompt order[n mod prompts], n counting from 0 in each stage, as that
// harness numbers a stage's requests (loadgen run_stage) and its
// shared-prefix generator maps a number to a prompt (get_request); with
// the open client requests cycle through order across stages. With the open client
// a stage's arrivals stop at its end; with inference-perf's it has exactly
// int(rate x duration) of them, as that harness schedules (the last may
// fall after the nominal end), and Arrival is relative to the stage's own
// start, which is only known when the run reaches it.
func (sc *Scenario) generateWorkload() *workload {
	d := sc.Data
	w := &workload{Prompts: make([]prompt, 0, d.NumGroups*d.NumPromptsPerGroup)}
	for g := 0; g < d.NumGroups; g++ {
		for q := 0; q < d.NumPromptsPerGroup; q++ {
			w.Prompts = append(w.Prompts, prompt{ID: len(w.Prompts), Group: g, Question: q, SystemLen: d.SystemPromptLen,
				Len: d.SystemPromptLen + d.QuestionLen})
		}
	}
	rng := rand.New(rand.NewPCG(sc.Seed, 0x5ca1ab1e))
	order := rng.Perm(len(w.Prompts))
	t := 0.0
	for si, st := range sc.Load.Stages {
		w.StageStart = append(w.StageStart, t)
		end := t + st.Duration
		at := t
		want := -1
		if sc.Client.drains() {
			want = int(st.Rate * st.Duration)
		}
		for n := 0; ; n++ {
			if sc.Load.Type == "poisson" {
				at += rng.ExpFloat64() / st.Rate
			}
			if (want < 0 && at >= end) || n == want {
				break
			}
			k := len(w.Requests) // open client: one cycle across stages
			if sc.Client.drains() {
				k = n // inference-perf: every stage starts again at prompt 0
			}
			p := &w.Prompts[order[k%len(order)]]
			w.Requests = append(w.Requests, scenarioRequest{Arrival: at, Stage: si, Prompt: p, OutputLen: d.OutputLen})
			if sc.Load.Type == "constant" {
				at += 1 / st.Rate
			}
		}
		t = end
	}
	return w
}

// schedulerSpec is one entry of `schedulers:`: either a name (a built-in
// profile, or a pick policy registered with registerPickPolicy), or a
// mapping with a name and an EndpointPickerConfig-style profile: weighted
// scorers and a picker.
type schedulerSpec struct {
	Name    string       `yaml:"name"`
	Picker  string       `yaml:"picker"` // max-score (default with scorers) | random
	Scorers []scorerSpec `yaml:"scorers"`
	Policy  string       `yaml:"policy"` // a registered pick policy (instead of scorers)
	Router  string       `yaml:"router"` // a trace-simulator routing policy (RouterOrder), default parameters
}

// scorerSpec is one weighted scorer of a profile.
type scorerSpec struct {
	Type   string  `yaml:"type"` // precise-prefix | approx-prefix | kv-cache-utilization | queue
	Weight float64 `yaml:"weight"`
	// precise-prefix: "minmax" (default; the llm-d scorer the published runs
	// used) or "absolute" (matched/total, its later form).
	Normalize string `yaml:"normalize"`
	// approx-prefix (GIE prefix-cache-scorer): its own block size in tokens,
	// blocks hashed at most, LRU entries per server.
	BlockSizeTokens      int `yaml:"block_size_tokens"`
	MaxPrefixBlocks      int `yaml:"max_prefix_blocks"`
	LRUCapacityPerServer int `yaml:"lru_capacity_per_server"`
}

// UnmarshalYAML accepts a bare name as well as the mapping.
func (s *schedulerSpec) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s.Name = n.Value
		return nil
	}
	type plain schedulerSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*s = schedulerSpec(p)
	return nil
}

// resolve turns a spec into a full profile: a bare built-in name expands to
// its profile, a bare registered policy name to that policy.
func (s schedulerSpec) resolve() (schedulerSpec, error) {
	if strings.TrimSpace(s.Name) == "" {
		return s, errors.New("scheduler needs a name")
	}
	if s.Policy == "" && s.Router == "" && len(s.Scorers) == 0 && s.Picker == "" {
		if b, ok := builtinProfiles[s.Name]; ok {
			b.Name = s.Name
			return b, nil
		}
		if _, ok := pickPolicies[s.Name]; ok {
			s.Policy = s.Name
			return s, nil
		}
		return s, fmt.Errorf("unknown scheduler %q (built-in: %s; registered policies: %s)", s.Name,
			strings.Join(sortedKeys(builtinProfiles), ", "), strings.Join(sortedKeys(pickPolicies), ", "))
	}
	if s.Router != "" {
		if len(s.Scorers) > 0 || s.Picker != "" || s.Policy != "" {
			return s, errors.New("router excludes policy, scorers and picker")
		}
		if _, ok := routerFactories[s.Router]; !ok {
			return s, fmt.Errorf("unknown router %q (%s)", s.Router, strings.Join(RouterOrder, ", "))
		}
		return s, nil
	}
	if s.Policy != "" {
		if len(s.Scorers) > 0 || s.Picker != "" {
			return s, errors.New("policy and scorers/picker are exclusive")
		}
		if _, ok := pickPolicies[s.Policy]; !ok {
			return s, fmt.Errorf("unknown pick policy %q", s.Policy)
		}
		return s, nil
	}
	if s.Picker == "" {
		s.Picker = "max-score"
	}
	switch s.Picker {
	case "random":
		if len(s.Scorers) > 0 {
			return s, errors.New("the random picker ignores scorers; drop them")
		}
	case "max-score":
		if len(s.Scorers) == 0 {
			return s, errors.New("max-score picker needs scorers")
		}
	default:
		return s, fmt.Errorf("picker %q: want max-score or random", s.Picker)
	}
	for i := range s.Scorers {
		sp := &s.Scorers[i]
		if !(sp.Weight >= 0) || math.IsInf(sp.Weight, 0) {
			return s, fmt.Errorf("scorer %s: weight must be finite and >= 0", sp.Type)
		}
		switch sp.Type {
		case "precise-prefix":
			if sp.Normalize == "" {
				sp.Normalize = "minmax"
			}
			if sp.Normalize != "minmax" && sp.Normalize != "absolute" {
				return s, fmt.Errorf("precise-prefix normalize %q: want minmax or absolute", sp.Normalize)
			}
		case "approx-prefix":
			if sp.BlockSizeTokens == 0 {
				sp.BlockSizeTokens = 16
			}
			if sp.MaxPrefixBlocks == 0 {
				sp.MaxPrefixBlocks = 256
			}
			if sp.LRUCapacityPerServer == 0 {
				sp.LRUCapacityPerServer = 31250
			}
			if sp.BlockSizeTokens < 1 || sp.MaxPrefixBlocks < 1 || sp.LRUCapacityPerServer < 1 ||
				sp.LRUCapacityPerServer > maxScenarioBlocks {
				return s, errors.New("approx-prefix: block_size_tokens, max_prefix_blocks and lru_capacity_per_server must be >= 1")
			}
		case "kv-cache-utilization", "queue":
		default:
			return s, fmt.Errorf("unknown scorer type %q (precise-prefix, approx-prefix, kv-cache-utilization, queue)", sp.Type)
		}
	}
	return s, nil
}

// builtinProfiles are the scheduler configurations of llm-d's published
// capacity benchmarks (EndpointPickerConfig profiles), by the names the
// scenario files use. GIE's approximate prefix scorer defaults: 64-character
// blocks (16 tokens at its assumed 4 characters per token), 256 blocks, an
// LRU of 31,250 blocks per server.
var builtinProfiles = map[string]schedulerSpec{
	"precise": {Picker: "max-score", Scorers: []scorerSpec{
		{Type: "precise-prefix", Weight: 3, Normalize: "minmax"},
		{Type: "kv-cache-utilization", Weight: 2}, {Type: "queue", Weight: 2}}},
	"estimated": {Picker: "max-score", Scorers: []scorerSpec{
		{Type: "approx-prefix", Weight: 1, BlockSizeTokens: 16, MaxPrefixBlocks: 256, LRUCapacityPerServer: 31250},
		{Type: "kv-cache-utilization", Weight: 1}, {Type: "queue", Weight: 1}}},
	"load": {Picker: "max-score", Scorers: []scorerSpec{
		{Type: "queue", Weight: 1}, {Type: "kv-cache-utilization", Weight: 1}}},
	"random": {Picker: "random"},
}

// SetRouterReplicas runs every scheduler of the scenario as n independent
// endpoint-picker replicas (a what-if: the published deployments run one).
func (sc *Scenario) SetRouterReplicas(n int) error {
	sc.RouterReplicas = n
	return sc.validate()
}

// ScaleKeys are the scenario constants Scale accepts: the engine's step-time
// constants, its KV capacity and the scheduler's metrics period.
var ScaleKeys = []string{"prefill_tokens_per_s", "decode_itl_s", "decode_per_seq_s", "decode_per_kv_token_s",
	"shared_kv_read_share", "kv_tokens_per_pod", "metrics_interval_s"}

// Scale multiplies one constant of the scenario by f (the sensitivity
// table of docs/simulator.md) and validates the result.
func (sc *Scenario) Scale(key string, f float64) error {
	if !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("scale %s: factor must be positive and finite", key)
	}
	e := &sc.Engine
	switch key {
	case "prefill_tokens_per_s":
		e.PrefillTokensPerS *= f
	case "decode_itl_s":
		e.DecodeITL *= f
	case "decode_per_seq_s":
		e.DecodePerSeq *= f
	case "decode_per_kv_token_s":
		e.DecodePerKVToken *= f
	case "shared_kv_read_share":
		e.SharedKVReadShare = min(1, e.SharedKVReadShare*f)
	case "kv_tokens_per_pod":
		sc.KVTokensPerPod = int(math.Round(float64(sc.KVTokensPerPod) * f))
	case "metrics_interval_s":
		sc.MetricsPeriod *= f
	default:
		return fmt.Errorf("scale: unknown key %q (want one of %v)", key, ScaleKeys)
	}
	return sc.validate()
}
