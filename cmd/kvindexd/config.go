package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/prefixstore"
	"github.com/kvindex/kvindex/tokenization"
)

// Config is everything `kvindexd serve` can be told. Precedence, lowest first:
// built-in defaults, the config file (--config, YAML or JSON), KVINDEX_*
// environment variables, command-line flags.
type Config struct {
	GRPCAddr   string `json:"grpc_addr" yaml:"grpc_addr"`
	HTTPAddr   string `json:"http_addr" yaml:"http_addr"`
	ZMQBind    string `json:"zmq_bind" yaml:"zmq_bind"`
	BindEngine string `json:"bind_engine" yaml:"bind_engine"`
	// BindFirstSeq: the seq the bind socket's publishers start at (1 for
	// llm-d's publishers), so their first batch is not a late join.
	BindFirstSeq int            `json:"bind_first_seq" yaml:"bind_first_seq"`
	Endpoints    []EndpointSpec `json:"endpoints" yaml:"endpoints"`
	TopicFilter  string         `json:"topic_filter" yaml:"topic_filter"`
	AllTopics    bool           `json:"all_topics" yaml:"all_topics"`
	Workers      int            `json:"workers" yaml:"workers"`
	QueueSize    int            `json:"queue_size" yaml:"queue_size"`
	// ApplyStallTimeout: an event worker inside one index write longer
	// than this makes the daemon not ready (api.Config.ApplyStallTimeout).
	ApplyStallTimeout Duration `json:"apply_stall_timeout" yaml:"apply_stall_timeout"`
	// MaxTenants caps the tenants besides "default" holding workers
	// registered through Dynamo's POST /register (api.Config.MaxTenants).
	MaxTenants int `json:"max_tenants" yaml:"max_tenants"`

	Index    string `json:"index" yaml:"index"`
	Capacity int64  `json:"capacity" yaml:"capacity"`
	// Leases divides the connect-topology endpoints between daemons sharing a
	// Redis index (docs/operations.md, Redis).
	Leases   bool     `json:"leases" yaml:"leases"`
	LeaseTTL Duration `json:"lease_ttl" yaml:"lease_ttl"`
	DaemonID string   `json:"daemon_id" yaml:"daemon_id"`

	HashAlgo        string                 `json:"hash_algo" yaml:"hash_algo"`
	HashSeed        string                 `json:"hash_seed" yaml:"hash_seed"`
	BlockSize       int                    `json:"block_size" yaml:"block_size"`
	Models          map[string]ModelConfig `json:"models" yaml:"models" doc:"per-model overrides: engines serving different models may use other seeds, algorithms or block sizes; unset fields inherit the top-level ones; tokenizer is a directory with tokenizer.json, chat_template a Jinja2 file used instead of the tokenizer's"`
	TierWeights     string                 `json:"tier_weights" yaml:"tier_weights"`
	StorageReaders  string                 `json:"storage_readers" yaml:"storage_readers"`
	DigestCacheSize int                    `json:"digest_cache_size" yaml:"digest_cache_size"`
	KeyCacheSize    int                    `json:"key_cache_size" yaml:"key_cache_size"`

	TokenizersDir    []string          `json:"tokenizers_dir" yaml:"tokenizers_dir"`
	HFCacheDir       string            `json:"hf_cache_dir" yaml:"hf_cache_dir"`
	Tokenizers       map[string]string `json:"tokenizers" yaml:"tokenizers"`
	PrefixChunkBytes int               `json:"prefix_store_chunk_bytes" yaml:"prefix_store_chunk_bytes"`
	PrefixCapacity   int               `json:"prefix_store_capacity" yaml:"prefix_store_capacity"`
	// Request bounds of prompt scoring (docs/security.md, "Prompt limits").
	MaxPromptBytes           int `json:"max_prompt_bytes" yaml:"max_prompt_bytes"`
	TokenizeMaxInflightBytes int `json:"tokenize_max_inflight_bytes" yaml:"tokenize_max_inflight_bytes"`

	// The prediction check: a sample of scored requests is compared with the
	// blocks the engines later store (GET /v1/models, kvindexd_prediction_*).
	PredictionSampleRate float64  `json:"prediction_sample_rate" yaml:"prediction_sample_rate"`
	PredictionWindow     Duration `json:"prediction_window" yaml:"prediction_window"`
	PredictionCapacity   int      `json:"prediction_capacity" yaml:"prediction_capacity"`

	LogLevel  string `json:"log_level" yaml:"log_level"`
	LogFormat string `json:"log_format" yaml:"log_format"`

	// Pick: the default policy, the speculative-entry TTL and the routing
	// history of pods without events.
	PickPolicy      string   `json:"pick_policy" yaml:"pick_policy"`
	SpecTTL         Duration `json:"speculative_ttl" yaml:"speculative_ttl"`
	HistoryTTL      Duration `json:"history_ttl" yaml:"history_ttl"`
	HistoryCapacity int      `json:"history_capacity" yaml:"history_capacity"`
	// Picks awaiting their engine's feedback (POST /v1/feedback).
	FeedbackCapacity int      `json:"feedback_capacity" yaml:"feedback_capacity"`
	FeedbackTTL      Duration `json:"feedback_ttl" yaml:"feedback_ttl"`
	// The Dynamo API's LocalBlockHash translation table.
	DynamoHashCapacity int `json:"dynamo_hash_capacity" yaml:"dynamo_hash_capacity"`
	// P/D picks' disaggregation decision (routing.PDParams).
	PickMaxLocalPrefillTokens int `json:"pick_max_local_prefill_tokens" yaml:"pick_max_local_prefill_tokens"`
	PickMaxPrefillWaiting     int `json:"pick_max_prefill_waiting" yaml:"pick_max_prefill_waiting"`
	// Security: TLS, tokens, admin API, endpoint policy, HTTP limits
	// (security.go).
	SecurityConfig `yaml:",inline"`
	// SnapshotConfig: the in-memory index saved and reloaded (snapshot.go).
	SnapshotConfig `yaml:",inline"`
	// Limits: caps on what publishers can make the daemon hold (config_limits.go).
	LimitsConfig `yaml:",inline"`
	// Discovery subscribes to engine pods found in Kubernetes.
	Discovery DiscoveryConfig `json:"discovery" yaml:"discovery"`
}

// ModelConfig overrides the key settings for one model (config file only):
// engines serving different models may run with different seeds, algorithms
// or block sizes.
type ModelConfig struct {
	HashAlgo  string `json:"hash_algo" yaml:"hash_algo"`
	HashSeed  string `json:"hash_seed" yaml:"hash_seed"`
	BlockSize int    `json:"block_size" yaml:"block_size"`
	// Tokenizer is a directory holding tokenizer.json (+ tokenizer_config.json).
	Tokenizer string `json:"tokenizer" yaml:"tokenizer"`
	// ChatTemplate is a Jinja2 chat template file used for the model's chat
	// requests instead of the tokenizer's own (the engine's --chat-template).
	ChatTemplate string `json:"chat_template" yaml:"chat_template"`
}

// EndpointSpec is one engine publisher to connect to. On the command line:
// address[,pod=NAME][,model=NAME][,engine=vllm|sglang|trtllm][,replay=ADDRESS][,snapshot=ADDRESS][,role=ROLE].
type EndpointSpec struct {
	Address string `json:"address" yaml:"address"`
	Pod     string `json:"pod" yaml:"pod"`
	Model   string `json:"model" yaml:"model"`
	Engine  string `json:"engine" yaml:"engine"`
	Replay  string `json:"replay" yaml:"replay"`
	// Snapshot is SGLang's snapshot_endpoint (snapshot-v1).
	Snapshot string `json:"snapshot" yaml:"snapshot"`
	// Role is the pod's P/D role, shown in /v1/pods: prefill, decode,
	// both, prefill-decode or encode (llm-d.ai/role's values).
	Role string `json:"role" yaml:"role"`
}

// DefaultConfig is what the daemon runs with when told nothing. Every
// numeric value comes from its part's option table (through that part's
// DefaultConfig), never from a literal here.
func DefaultConfig() Config {
	ev, ix, ps := kvevents.DefaultConfig(), indexer.DefaultConfig(), prefixstore.DefaultConfig()
	return Config{
		GRPCAddr:          ":50051",
		HTTPAddr:          ":8080",
		ZMQBind:           ev.Bind,
		BindEngine:        "vllm",
		TopicFilter:       ev.TopicFilter,
		Workers:           ev.Workers,
		QueueSize:         ev.QueueSize,
		ApplyStallTimeout: Duration(api.Options.ApplyStallTimeout.Default),
		MaxTenants:        int(api.Options.MaxTenants.Default),
		Index:             "memory",
		Capacity:          ix.Index.Capacity,
		LeaseTTL:          Duration(ix.Leases.TTL),
		HashAlgo:          string(ix.Keys.Algo),  // vLLM's default since v0.10.2
		HashSeed:          blockkeys.DefaultSeed, // vLLM's seed without PYTHONHASHSEED (sha256 family)
		BlockSize:         ix.Keys.BlockSize,
		TierWeights:       "gpu=1.0,cpu=0.8,disk=0.5,external=0.3,shared=0.4",
		StorageReaders:    "",
		DigestCacheSize:   ix.DigestCacheSize,
		KeyCacheSize:      ix.KeyCacheSize,
		LogLevel:          "info",
		LogFormat:         "text",
		SecurityConfig:    defaultSecurity(),
		SnapshotConfig: SnapshotConfig{SnapshotInterval: Duration(ix.Persist.Interval), SnapshotMaxAge: Duration(ix.Persist.MaxAge),
			PeerMaxBytes: ix.Peers.MaxBytes, PeerTimeout: Duration(ix.Peers.Timeout)},
		LimitsConfig: defaultLimits(ev, ix),

		PrefixChunkBytes:         ps.ChunkBytes,
		PrefixCapacity:           ps.Capacity,
		MaxPromptBytes:           ps.MaxPromptBytes,
		TokenizeMaxInflightBytes: ps.MaxInflightBytes,

		PickPolicy:      routing.DefaultPolicy,
		SpecTTL:         Duration(ix.Pick.SpeculativeTTL),
		HistoryTTL:      Duration(ix.Pick.HistoryTTL),
		HistoryCapacity: ix.Pick.HistoryCapacity,

		FeedbackCapacity: ix.Pick.FeedbackCapacity,
		FeedbackTTL:      Duration(ix.Pick.FeedbackTTL),

		DynamoHashCapacity: ix.DynamoHashCapacity,

		PickMaxLocalPrefillTokens: int(indexer.Options.PDMaxLocalPrefillTokens.Default),
		PickMaxPrefillWaiting:     int(indexer.Options.PDMaxPrefillWait.Default),

		PredictionSampleRate: ix.Prediction.SampleRate,
		PredictionWindow:     Duration(ix.Prediction.Window),
		PredictionCapacity:   ix.Prediction.Capacity,
		Discovery:            defaultDiscoveryConfig(),
	}
}

func parseEndpointSpec(s string) (EndpointSpec, error) {
	parts := strings.Split(s, ",")
	ep := EndpointSpec{Address: strings.TrimSpace(parts[0])}
	if ep.Address == "" {
		return ep, fmt.Errorf("endpoint %q: empty address", s)
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return ep, fmt.Errorf("endpoint %q: option %q is not key=value", s, p)
		}
		switch k {
		case "pod":
			ep.Pod = v
		case "model":
			ep.Model = v
		case "engine":
			ep.Engine = v
		case "replay":
			ep.Replay = v
		case "snapshot":
			ep.Snapshot = v
		case "role":
			ep.Role = v
		default:
			return ep, fmt.Errorf("endpoint %q: unknown option %q (pod, model, engine, replay, snapshot, role)", s, k)
		}
	}
	if _, ok := routing.ParseRole(ep.Role); !ok {
		return ep, fmt.Errorf("endpoint %q: role %q: want prefill, decode, both, prefill-decode or encode", s, ep.Role)
	}
	if _, ok := blockkeys.ParseEngine(ep.Engine); !ok {
		return ep, fmt.Errorf("endpoint %q: engine %q: want vllm, sglang or trtllm", s, ep.Engine)
	}
	return ep, nil
}

// endpointsFlag appends endpoints; env values may list several separated by
// ';' or whitespace.
type endpointsFlag struct{ dst *[]EndpointSpec }

func (f endpointsFlag) String() string {
	if f.dst == nil {
		return ""
	}
	var s []string
	for _, e := range *f.dst {
		s = append(s, e.Address)
	}
	return strings.Join(s, ";")
}

func (f endpointsFlag) Set(v string) error {
	for _, one := range strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ' ' || r == '\n' || r == '\t' }) {
		ep, err := parseEndpointSpec(one)
		if err != nil {
			return err
		}
		*f.dst = append(*f.dst, ep)
	}
	return nil
}

// listFlag appends to a string list (comma or repeat).
type listFlag struct{ dst *[]string }

func (f listFlag) String() string {
	if f.dst == nil {
		return ""
	}
	return strings.Join(*f.dst, ",")
}

func (f listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*f.dst = append(*f.dst, p)
		}
	}
	return nil
}

// mapFlag sets model=path pairs.
type mapFlag struct{ dst *map[string]string }

func (f mapFlag) String() string {
	if f.dst == nil {
		return ""
	}
	var s []string
	for k, v := range *f.dst {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func (f mapFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, val, ok := strings.Cut(p, "=")
		if !ok || k == "" || val == "" {
			return fmt.Errorf("%q is not model=path", p)
		}
		if *f.dst == nil {
			*f.dst = map[string]string{}
		}
		(*f.dst)[k] = val
	}
	return nil
}

// flagSet declares every serve flag bound to cfg.
func flagSet(cfg *Config, configPath *string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvindexd serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: kvindexd serve [flags]\n\n"+
			"Every flag can also be set as a KVINDEX_* environment variable (--grpc-addr: KVINDEX_GRPC_ADDR)\n"+
			"or a key of the --config file (grpc_addr); flags win over the environment, which wins over the file.\n"+
			"docs/configuration.md lists them all.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(configPath, "config", *configPath, "config file (YAML or JSON); flags and KVINDEX_* env override it")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "gRPC listen address: host:port, or unix:///path for a unix socket (mode 0660) (\"\" = off)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP/JSON listen address: host:port, or unix:///path for a unix socket (mode 0660) (\"\" = off)")
	fs.StringVar(&cfg.ZMQBind, "zmq-bind", cfg.ZMQBind, "ZMQ address the SUB socket binds for engines that connect (\"\" = off)")
	fs.StringVar(&cfg.BindEngine, "bind-engine", cfg.BindEngine, "engine kind publishing to the bind socket: "+blockkeys.EngineNames()+" (an sglang stream that publishes EAGLE token pairs is scored as sglang-eagle by itself)")
	fs.Var(endpointsFlag{&cfg.Endpoints}, "endpoint", "engine publisher to connect to, repeatable: address[,pod=..][,model=..][,engine=vllm|sglang|trtllm][,replay=..][,snapshot=..][,role=prefill|decode|both|encode]")
	fs.StringVar(&cfg.TopicFilter, "topic-filter", cfg.TopicFilter, "ZMQ topic prefix to subscribe to")
	fs.BoolVar(&cfg.AllTopics, "all-topics", cfg.AllTopics, "subscribe to every topic (vLLM's default topic is \"\"; such streams need --endpoint ...,pod=NAME)")
	intOpt(fs, &cfg.BindFirstSeq, kvevents.Options.BindFirstSeq)
	intOpt(fs, &cfg.Workers, kvevents.Options.Workers)
	intOpt(fs, &cfg.QueueSize, kvevents.Options.QueueSize)
	durationOpt(fs, &cfg.ApplyStallTimeout, api.Options.ApplyStallTimeout)
	intOpt(fs, &cfg.MaxTenants, api.Options.MaxTenants)
	fs.StringVar(&cfg.Index, "index", cfg.Index, "index backend: memory | redis://[user:pass@]host:port/db | rediss://... | redis-cluster://h1:p1,h2:p2")
	int64Opt(fs, &cfg.Capacity, kvindex.MemoryOptions.Capacity)
	fs.BoolVar(&cfg.Leases, "leases", cfg.Leases, "share the --endpoint list with other daemons through leases in Redis (connect topology)")
	durationOpt(fs, &cfg.LeaseTTL, indexer.Options.LeaseTTL)
	fs.StringVar(&cfg.DaemonID, "daemon-id", cfg.DaemonID, "with --leases: this daemon's unique id (default hostname-pid)")
	fs.StringVar(&cfg.HashAlgo, "hash-algo", cfg.HashAlgo, "vLLM --prefix-caching-hash-algo: "+blockkeys.HashAlgoNames())
	fs.StringVar(&cfg.HashSeed, "hash-seed", cfg.HashSeed, "the engines' PYTHONHASHSEED (string, as set in their environment); the default is vLLM's seed when PYTHONHASHSEED is unset (sha256 family, vLLM since PR #51875); the xxhash family and older vLLM seed randomly unless PYTHONHASHSEED is set")
	intOpt(fs, &cfg.BlockSize, indexer.Options.BlockSize)
	fs.StringVar(&cfg.TierWeights, "tier-weights", cfg.TierWeights, "score weight per tier: gpu=1,cpu=0.8,disk=0.5,external=0.3,shared=0.4 (each 0..1000; shared: blocks a pod can load from a storage source, see --storage-readers)")
	fs.StringVar(&cfg.StorageReaders, "storage-readers", cfg.StorageReaders, "storage sources (the pod slot of a storage publisher's topic, e.g. llm-d's kv@SHARED_STORAGE@<model>) and the pods that load their blocks, credited to them as the shared tier: SOURCE=podA,podB;SOURCE=* (every pod publishing for the model);SOURCE= (none). Sources are never scored or picked. Default none: a topic naming SHARED_STORAGE or OBJECT_STORE that is not listed here is refused (kvindexd_storage_claims_refused_total)")
	intOpt(fs, &cfg.KeyCacheSize, indexer.Options.KeyCacheSize)
	intOpt(fs, &cfg.DigestCacheSize, applier.Options.DigestCacheSize)
	fs.Var(listFlag{&cfg.TokenizersDir}, "tokenizers-dir", "directory whose subdirectories hold tokenizer.json per model (repeatable)")
	fs.StringVar(&cfg.HFCacheDir, "hf-cache-dir", cfg.HFCacheDir, "HuggingFace hub cache (models--org--name/snapshots/...)")
	fs.Var(mapFlag{&cfg.Tokenizers}, "tokenizer", "model=path of a tokenizer directory (repeatable or comma-separated)")
	intOpt(fs, &cfg.PrefixChunkBytes, prefixstore.Options.ChunkBytes)
	intOpt(fs, &cfg.PrefixCapacity, prefixstore.Options.Capacity)
	intOpt(fs, &cfg.MaxPromptBytes, prefixstore.Options.MaxPromptBytes)
	intOpt(fs, &cfg.TokenizeMaxInflightBytes, prefixstore.Options.MaxInflightBytes)
	fs.StringVar(&cfg.PickPolicy, "pick-policy", cfg.PickPolicy, "default policy of /v1/pick: "+strings.Join(routing.Names(), ", "))
	durationOpt(fs, &cfg.SpecTTL, indexer.Options.SpeculativeTTL)
	durationOpt(fs, &cfg.HistoryTTL, indexer.Options.HistoryTTL)
	intOpt(fs, &cfg.HistoryCapacity, indexer.Options.HistoryCapacity)
	intOpt(fs, &cfg.FeedbackCapacity, indexer.Options.FeedbackCapacity)
	durationOpt(fs, &cfg.FeedbackTTL, indexer.Options.FeedbackTTL)
	intOpt(fs, &cfg.DynamoHashCapacity, indexer.Options.DynamoHashCapacity)
	intOpt(fs, &cfg.PickMaxLocalPrefillTokens, indexer.Options.PDMaxLocalPrefillTokens)
	intOpt(fs, &cfg.PickMaxPrefillWaiting, indexer.Options.PDMaxPrefillWait)
	floatOpt(fs, &cfg.PredictionSampleRate, indexer.Options.PredictionSampleRate)
	durationOpt(fs, &cfg.PredictionWindow, indexer.Options.PredictionWindow)
	intOpt(fs, &cfg.PredictionCapacity, indexer.Options.PredictionCapacity)
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug | info | warn | error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text | json")
	securityFlags(fs, &cfg.SecurityConfig)
	snapshotFlags(fs, &cfg.SnapshotConfig)
	limitFlags(fs, &cfg.LimitsConfig)
	discoveryFlags(fs, &cfg.Discovery)
	return fs
}

// envName maps a flag name to its environment variable: grpc-addr ->
// KVINDEX_GRPC_ADDR.
func envName(flagName string) string {
	return "KVINDEX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// loadConfig applies defaults, file, env and flags in that order. On -h it
// prints the usage to help and returns flag.ErrHelp.
func loadConfig(args []string, getenv func(string) string, help io.Writer) (Config, error) {
	cfg := DefaultConfig()
	configPath := getenv("KVINDEX_CONFIG")
	// The file has to be read before the flags are declared so that its
	// values become their defaults; find --config by a pre-scan.
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		if hasVal {
			configPath = val
		} else if i+1 < len(args) {
			configPath = args[i+1]
		}
	}
	if configPath != "" {
		if err := readConfigFile(configPath, &cfg); err != nil {
			return cfg, err
		}
	}
	// help receives the usage on -h, verbatim; a bad flag or value comes
	// back as an error, which run redacts (it may echo a URL with a
	// password).
	fs := flagSet(&cfg, &configPath, help)
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		if v := getenv(envName(f.Name)); v != "" && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %v", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return cfg, envErr
	}
	if err := parseFlags(fs, args, help); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}

func readConfigFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(cfg); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	default: // YAML is a superset of JSON
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	for i, ep := range cfg.Endpoints {
		if ep.Address == "" {
			return fmt.Errorf("config file %s: endpoints[%d] has no address", path, i)
		}
	}
	return nil
}

func (c *Config) validate() error {
	if err := c.validateRanges(); err != nil {
		return err
	}
	if _, _, err := c.keyConfigs(); err != nil {
		return err
	}
	if _, err := parseTierWeights(c.TierWeights); err != nil {
		return err
	}
	if _, err := parseStorageReaders(c.StorageReaders); err != nil {
		return err
	}
	if _, ok := blockkeys.ParseEngine(c.BindEngine); !ok {
		return fmt.Errorf("--bind-engine %q: want vllm, sglang or trtllm", c.BindEngine)
	}
	for _, ep := range c.Endpoints {
		if _, ok := blockkeys.ParseEngine(ep.Engine); !ok {
			return fmt.Errorf("endpoint %s: engine %q: want vllm, sglang or trtllm", ep.Address, ep.Engine)
		}
	}
	// The ranges are checked above; what is left is the relation between the
	// two prompt bounds.
	if err := prefixstore.ValidateConfig(c.prefixConfig()); err != nil {
		return err
	}
	if _, err := c.pickConfig(); err != nil {
		return err
	}
	for name, m := range c.Models {
		if m.ChatTemplate == "" {
			continue
		}
		if st, err := os.Stat(m.ChatTemplate); err != nil {
			return fmt.Errorf("models[%s].chat_template: %w", name, err)
		} else if st.IsDir() {
			return fmt.Errorf("models[%s].chat_template %s: want a template file", name, m.ChatTemplate)
		}
	}
	if c.GRPCAddr == "" && c.HTTPAddr == "" {
		return errors.New("both --grpc-addr and --http-addr are off: nothing would serve scores")
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
	}
	if err := c.validateSecurity(); err != nil {
		return err
	}
	if err := c.validateSnapshot(c.Index); err != nil {
		return err
	}
	if err := c.validateTokenizers(); err != nil {
		return err
	}
	return c.validateDiscovery()
}

// pickConfig turns the pick settings into the indexer's PickConfig (the
// shared speculative store is the daemon's to add).
func (c *Config) pickConfig() (indexer.PickConfig, error) {
	pc := indexer.PickConfig{DefaultPolicy: c.PickPolicy, HistoryCapacity: c.HistoryCapacity,
		FeedbackCapacity: c.FeedbackCapacity, FeedbackTTL: time.Duration(c.FeedbackTTL)}
	if c.PickPolicy != "" {
		if _, err := routing.New(c.PickPolicy, routing.Defaults()); err != nil {
			return pc, fmt.Errorf("--pick-policy: %w", err)
		}
	}
	pc.SpeculativeTTL, pc.HistoryTTL = time.Duration(c.SpecTTL), time.Duration(c.HistoryTTL) // ranges checked by validateRanges
	params := routing.Defaults()
	params.PD = routing.PDParams{MaxLocalPrefillTokens: c.PickMaxLocalPrefillTokens, MaxPrefillWaiting: c.PickMaxPrefillWaiting}
	pc.Params = &params
	return pc, nil
}

// prefixConfig is the prefix store's configuration (ranges checked by
// validateRanges).
func (c *Config) prefixConfig() prefixstore.Config {
	return prefixstore.Config{ChunkBytes: c.PrefixChunkBytes, Capacity: c.PrefixCapacity,
		MaxPromptBytes: c.MaxPromptBytes, MaxInflightBytes: c.TokenizeMaxInflightBytes}
}

// validateTokenizers checks at start that every tokenizer named explicitly
// is there: a typo would otherwise surface only as a failed request.
func (c *Config) validateTokenizers() error {
	names := make([]string, 0, len(c.Tokenizers))
	for name := range c.Tokenizers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if dir := c.Tokenizers[name]; !tokenization.HasTokenizerFile(dir) {
			return fmt.Errorf("--tokenizer %s=%s: no tokenizer.json or tokenizer.json.gz in %s", name, dir, dir)
		}
	}
	names = names[:0]
	for name := range c.Models {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if dir := c.Models[name].Tokenizer; dir != "" && !tokenization.HasTokenizerFile(dir) {
			return fmt.Errorf("models[%s].tokenizer %s: no tokenizer.json or tokenizer.json.gz there", name, dir)
		}
	}
	for _, dir := range c.TokenizersDir {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return fmt.Errorf("--tokenizers-dir %s: not a directory", dir)
		}
	}
	return nil
}

// keyConfigs returns the default key config and the per-model overrides
// (unset override fields inherit the default).
func (c *Config) keyConfigs() (blockkeys.KeyConfig, map[string]blockkeys.KeyConfig, error) {
	def := blockkeys.KeyConfig{Algo: blockkeys.HashAlgo(c.HashAlgo), Seed: c.HashSeed, BlockSize: c.BlockSize}
	// NewHasher is the one place that knows what a valid key config is.
	if _, err := blockkeys.NewHasher(def); err != nil {
		return def, nil, err
	}
	per := map[string]blockkeys.KeyConfig{}
	for name, m := range c.Models {
		kc := def
		if m.HashAlgo != "" {
			kc.Algo = blockkeys.HashAlgo(m.HashAlgo)
		}
		if m.HashSeed != "" {
			kc.Seed = m.HashSeed
		}
		if m.BlockSize != 0 {
			kc.BlockSize = m.BlockSize
		}
		if _, err := blockkeys.NewHasher(kc); err != nil {
			return def, nil, fmt.Errorf("models[%s]: %w", name, err)
		}
		per[name] = kc
	}
	return def, per, nil
}

// predictionConfig converts the prediction settings (ranges checked by
// validateRanges).
func (c *Config) predictionConfig() indexer.PredictionConfig {
	return indexer.PredictionConfig{SampleRate: c.PredictionSampleRate, Capacity: c.PredictionCapacity,
		Window: time.Duration(c.PredictionWindow)}
}

// parseStorageReaders parses --storage-readers over indexer's defaults:
// "SOURCE=a,b;SOURCE=*;SOURCE=" (';'-separated; '*' = every pod of the
// model, nothing = no reader).
func parseStorageReaders(s string) (map[string][]string, error) {
	m := indexer.DefaultStorageReaders()
	for _, e := range strings.Split(s, ";") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		k, v, ok := strings.Cut(e, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("--storage-readers: %q is not SOURCE=pod,pod (or SOURCE=*)", e)
		}
		if v = strings.TrimSpace(v); v == "*" {
			m[k] = nil
			continue
		}
		readers := []string{}
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == "*" {
				return nil, fmt.Errorf("--storage-readers: %s: '*' stands alone", k)
			} else if p != "" {
				readers = append(readers, p)
			}
		}
		m[k] = readers
	}
	return m, nil
}

func parseTierWeights(s string) (kvindex.TierWeights, error) {
	w := kvindex.DefaultTierWeights()
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return w, fmt.Errorf("--tier-weights: %q is not tier=weight", p)
		}
		t, ok := event.TierByName(strings.TrimSpace(k))
		if !ok {
			return w, fmt.Errorf("--tier-weights: unknown tier %q (gpu, cpu, disk, external, shared)", k)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return w, fmt.Errorf("--tier-weights: %s weight %q is not a number", k, v)
		}
		w[t] = f
	}
	if err := w.Validate(); err != nil {
		return w, fmt.Errorf("--tier-weights: %w", err)
	}
	return w, nil
}
