package prefixstore

import (
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/internal/option"
)

// Options is the one declaration of Config's tunables: each row's default,
// range and help. DefaultConfig, ValidateConfig, New's reading of a zero
// field and kvindexd's flags all read it. The upper ends of the prompt
// bounds: a prompt cannot be above the largest HTTP body, and tokenizing
// holds up to ~30 bytes per in-flight prompt byte.
var Options = struct {
	ChunkBytes, Capacity, MaxPromptBytes, MaxInflightBytes option.Int
}{
	ChunkBytes: option.Int{Name: "prefix-store-chunk-bytes", Default: DefaultChunkBytes, Min: 0, Max: 1 << 20,
		Help: "prefix store chunk size in bytes"},
	Capacity: option.Int{Name: "prefix-store-capacity", Default: DefaultCapacity, Min: 0, Max: 1 << 24,
		Help: "prefix store size in chunks per model, least recently used dropped"},
	MaxPromptBytes: option.Int{Name: "max-prompt-bytes", Default: DefaultMaxPromptBytes, Min: 1, Max: 1 << 30,
		Help: "longest prompt (or rendered chat) tokenized for a score, bytes; longer ones are refused with 400 / InvalidArgument"},
	MaxInflightBytes: option.Int{Name: "tokenize-max-inflight-bytes", Default: DefaultMaxInflightBytes, Min: 1, Max: 1 << 32,
		Help: "bytes of prompts tokenized at once (at least --max-prompt-bytes); a prompt waits up to 2s for room, then 429 / ResourceExhausted"},
}

// DefaultConfig is Config with every field at its default.
func DefaultConfig() Config { return Config{}.withDefaults() }

// ValidateConfig checks cfg against the ranges of Options (a zero field is
// valid: it stands for the default). MaxInflightBytes below MaxPromptBytes
// is an error here, since a prompt of the largest size could never start;
// New raises it instead for callers that do not validate.
func ValidateConfig(cfg Config) error {
	cfg = cfg.withDefaults()
	o := &Options
	if err := errors.Join(o.ChunkBytes.Check(int64(cfg.ChunkBytes)), o.Capacity.Check(int64(cfg.Capacity)),
		o.MaxPromptBytes.Check(int64(cfg.MaxPromptBytes)), o.MaxInflightBytes.Check(int64(cfg.MaxInflightBytes))); err != nil {
		return err
	}
	if cfg.MaxInflightBytes < cfg.MaxPromptBytes {
		return fmt.Errorf("--%s %d: below --%s (%d)", o.MaxInflightBytes.Name, cfg.MaxInflightBytes, o.MaxPromptBytes.Name, cfg.MaxPromptBytes)
	}
	return nil
}

// withDefaults is the one place a zero field of Config becomes its default.
func (cfg Config) withDefaults() Config {
	o := &Options
	cfg.ChunkBytes = int(o.ChunkBytes.Or(int64(cfg.ChunkBytes)))
	cfg.Capacity = int(o.Capacity.Or(int64(cfg.Capacity)))
	cfg.MaxPromptBytes = int(o.MaxPromptBytes.Or(int64(cfg.MaxPromptBytes)))
	cfg.MaxInflightBytes = int(o.MaxInflightBytes.Or(int64(cfg.MaxInflightBytes)))
	if cfg.MaxPromptTokens <= 0 { // fixed, not a flag: the token_ids bound
		cfg.MaxPromptTokens = DefaultMaxPromptTokens
	}
	return cfg
}
