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

	"go.yaml.in/yaml/v3"

	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvindex"
)

// Config is everything `kvindexd serve` can be told. Precedence, lowest first:
// built-in defaults, the config file (--config, YAML or JSON), KVINDEX_*
// environment variables, command-line flags.
type Config struct {
	GRPCAddr    string         `json:"grpc_addr" yaml:"grpc_addr"`
	HTTPAddr    string         `json:"http_addr" yaml:"http_addr"`
	ZMQBind     string         `json:"zmq_bind" yaml:"zmq_bind"`
	BindEngine  string         `json:"bind_engine" yaml:"bind_engine"`
	Endpoints   []EndpointSpec `json:"endpoints" yaml:"endpoints"`
	TopicFilter string         `json:"topic_filter" yaml:"topic_filter"`
	AllTopics   bool           `json:"all_topics" yaml:"all_topics"`
	Workers     int            `json:"workers" yaml:"workers"`
	QueueSize   int            `json:"queue_size" yaml:"queue_size"`

	Index    string `json:"index" yaml:"index"`
	Capacity int64  `json:"capacity" yaml:"capacity"`
	// Leases divides the connect-topology endpoints between daemons sharing a
	// Redis index (see the Redis section of the README).
	Leases   bool   `json:"leases" yaml:"leases"`
	LeaseTTL string `json:"lease_ttl" yaml:"lease_ttl"`
	DaemonID string `json:"daemon_id" yaml:"daemon_id"`

	HashAlgo        string                 `json:"hash_algo" yaml:"hash_algo"`
	HashSeed        string                 `json:"hash_seed" yaml:"hash_seed"`
	BlockSize       int                    `json:"block_size" yaml:"block_size"`
	Models          map[string]ModelConfig `json:"models" yaml:"models"`
	TierWeights     string                 `json:"tier_weights" yaml:"tier_weights"`
	DigestCacheSize int                    `json:"digest_cache_size" yaml:"digest_cache_size"`
	KeyCacheSize    int                    `json:"key_cache_size" yaml:"key_cache_size"`

	TokenizersDir    []string          `json:"tokenizers_dir" yaml:"tokenizers_dir"`
	HFCacheDir       string            `json:"hf_cache_dir" yaml:"hf_cache_dir"`
	Tokenizers       map[string]string `json:"tokenizers" yaml:"tokenizers"`
	PrefixChunkBytes int               `json:"prefix_store_chunk_bytes" yaml:"prefix_store_chunk_bytes"`
	PrefixCapacity   int               `json:"prefix_store_capacity" yaml:"prefix_store_capacity"`

	LogLevel  string `json:"log_level" yaml:"log_level"`
	LogFormat string `json:"log_format" yaml:"log_format"`
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
}

// EndpointSpec is one engine publisher to connect to. On the command line:
// address[,pod=NAME][,model=NAME][,engine=vllm|sglang][,replay=ADDRESS].
type EndpointSpec struct {
	Address string `json:"address" yaml:"address"`
	Pod     string `json:"pod" yaml:"pod"`
	Model   string `json:"model" yaml:"model"`
	Engine  string `json:"engine" yaml:"engine"`
	Replay  string `json:"replay" yaml:"replay"`
}

// DefaultConfig is what the daemon runs with when told nothing.
func DefaultConfig() Config {
	return Config{
		GRPCAddr:    ":50051",
		HTTPAddr:    ":8080",
		ZMQBind:     kvevents.DefaultBind,
		BindEngine:  "vllm",
		TopicFilter: kvevents.DefaultTopicFilter,
		Workers:     0, // kvevents default (one per CPU)
		QueueSize:   0, // kvevents default
		Index:       "memory",
		LeaseTTL:    "10s",
		HashAlgo:    string(kvindex.AlgoSHA256), // vLLM's default since v0.10.2
		HashSeed:    "",
		BlockSize:   16,
		TierWeights: "gpu=1.0,cpu=0.8,disk=0.5,external=0.3",
		LogLevel:    "info",
		LogFormat:   "text",
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
		default:
			return ep, fmt.Errorf("endpoint %q: unknown option %q (pod, model, engine, replay)", s, k)
		}
	}
	if _, ok := kvindex.ParseEngine(ep.Engine); !ok {
		return ep, fmt.Errorf("endpoint %q: engine %q: want vllm or sglang", s, ep.Engine)
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
	fs.StringVar(configPath, "config", *configPath, "config file (YAML or JSON); flags and KVINDEX_* env override it")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "gRPC listen address (\"\" = off)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP/JSON listen address (\"\" = off)")
	fs.StringVar(&cfg.ZMQBind, "zmq-bind", cfg.ZMQBind, "ZMQ address the SUB socket binds for engines that connect (\"\" = off)")
	fs.StringVar(&cfg.BindEngine, "bind-engine", cfg.BindEngine, "engine kind publishing to the bind socket: vllm or sglang")
	fs.Var(endpointsFlag{&cfg.Endpoints}, "endpoint", "engine publisher to connect to, repeatable: address[,pod=..][,model=..][,engine=vllm|sglang][,replay=..]")
	fs.StringVar(&cfg.TopicFilter, "topic-filter", cfg.TopicFilter, "ZMQ topic prefix to subscribe to")
	fs.BoolVar(&cfg.AllTopics, "all-topics", cfg.AllTopics, "subscribe to every topic (vLLM's default topic is \"\"; such streams need --endpoint ...,pod=NAME)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "event apply workers (0 = number of CPUs)")
	fs.IntVar(&cfg.QueueSize, "queue-size", cfg.QueueSize, "batches queued per worker before overflow is counted (0 = default)")
	fs.StringVar(&cfg.Index, "index", cfg.Index, "index backend: memory | redis://[user:pass@]host:port/db | rediss://... | redis-cluster://h1:p1,h2:p2")
	fs.Int64Var(&cfg.Capacity, "capacity", cfg.Capacity, "in-memory index bound in (block, pod) entries (0 = default)")
	fs.BoolVar(&cfg.Leases, "leases", cfg.Leases, "share the --endpoint list with other daemons through leases in Redis (connect topology)")
	fs.StringVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "with --leases: how long a dead daemon keeps its endpoints before another takes them over")
	fs.StringVar(&cfg.DaemonID, "daemon-id", cfg.DaemonID, "with --leases: this daemon's unique id (default hostname-pid)")
	fs.StringVar(&cfg.HashAlgo, "hash-algo", cfg.HashAlgo, "vLLM --prefix-caching-hash-algo: "+kvindex.HashAlgoNames())
	fs.StringVar(&cfg.HashSeed, "hash-seed", cfg.HashSeed, "the engines' PYTHONHASHSEED (string, as set in their environment)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "vLLM --block-size")
	fs.StringVar(&cfg.TierWeights, "tier-weights", cfg.TierWeights, "score weight per tier: gpu=1,cpu=0.8,disk=0.5,external=0.3")
	fs.IntVar(&cfg.KeyCacheSize, "key-cache-size", cfg.KeyCacheSize, "request-path block keys cached per key config, so shared prompt prefixes are not re-hashed (0 = default, -1 = off)")
	fs.IntVar(&cfg.DigestCacheSize, "digest-cache-size", cfg.DigestCacheSize, "recent block digests kept for the live parity check (0 = default)")
	fs.Var(listFlag{&cfg.TokenizersDir}, "tokenizers-dir", "directory whose subdirectories hold tokenizer.json per model (repeatable)")
	fs.StringVar(&cfg.HFCacheDir, "hf-cache-dir", cfg.HFCacheDir, "HuggingFace hub cache (models--org--name/snapshots/...)")
	fs.Var(mapFlag{&cfg.Tokenizers}, "tokenizer", "model=path of a tokenizer directory (repeatable or comma-separated)")
	fs.IntVar(&cfg.PrefixChunkBytes, "prefix-store-chunk-bytes", cfg.PrefixChunkBytes, "prefix store chunk size in bytes (0 = default)")
	fs.IntVar(&cfg.PrefixCapacity, "prefix-store-capacity", cfg.PrefixCapacity, "prefix store size in chunks (0 = default)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug | info | warn | error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text | json")
	return fs
}

// envName maps a flag name to its environment variable: grpc-addr ->
// KVINDEX_GRPC_ADDR.
func envName(flagName string) string {
	return "KVINDEX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// loadConfig applies defaults, file, env and flags in that order.
func loadConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
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
	fs := flagSet(&cfg, &configPath, out)
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
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
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
	if _, _, err := c.keyConfigs(); err != nil {
		return err
	}
	if _, err := parseTierWeights(c.TierWeights); err != nil {
		return err
	}
	if _, ok := kvindex.ParseEngine(c.BindEngine); !ok {
		return fmt.Errorf("--bind-engine %q: want vllm or sglang", c.BindEngine)
	}
	for _, ep := range c.Endpoints {
		if _, ok := kvindex.ParseEngine(ep.Engine); !ok {
			return fmt.Errorf("endpoint %s: engine %q: want vllm or sglang", ep.Address, ep.Engine)
		}
	}
	if c.Workers < 0 || c.QueueSize < 0 || c.Capacity < 0 {
		return errors.New("--workers, --queue-size and --capacity must not be negative")
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
	return nil
}

// keyConfigs returns the default key config and the per-model overrides
// (unset override fields inherit the default).
func (c *Config) keyConfigs() (kvindex.KeyConfig, map[string]kvindex.KeyConfig, error) {
	def := kvindex.KeyConfig{Algo: kvindex.HashAlgo(c.HashAlgo), Seed: c.HashSeed, BlockSize: c.BlockSize}
	// NewHasher is the one place that knows what a valid key config is.
	if _, err := kvindex.NewHasher(def); err != nil {
		return def, nil, err
	}
	per := map[string]kvindex.KeyConfig{}
	for name, m := range c.Models {
		kc := def
		if m.HashAlgo != "" {
			kc.Algo = kvindex.HashAlgo(m.HashAlgo)
		}
		if m.HashSeed != "" {
			kc.Seed = m.HashSeed
		}
		if m.BlockSize != 0 {
			kc.BlockSize = m.BlockSize
		}
		if _, err := kvindex.NewHasher(kc); err != nil {
			return def, nil, fmt.Errorf("models[%s]: %w", name, err)
		}
		per[name] = kc
	}
	return def, per, nil
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
		t, ok := kvindex.TierByName(strings.TrimSpace(k))
		if !ok {
			return w, fmt.Errorf("--tier-weights: unknown tier %q (gpu, cpu, disk, external)", k)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f < 0 {
			return w, fmt.Errorf("--tier-weights: %s weight %q is not a non-negative number", k, v)
		}
		w[t] = f
	}
	return w, nil
}
