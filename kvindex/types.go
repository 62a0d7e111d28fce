// Package kvindex owns block keys (vLLM-exact hashing), the Index interface and
// its in-memory backend, the event applier with its live parity check, and the
// scorer. It knows nothing of ZeroMQ, gRPC or HTTP, nor how its parts are
// wired: package indexer builds them on one interner, kvevents hands it decoded,
// engine-neutral batches through the indexer, and scores are asked there.
package kvindex

import (
	"context"
	"strings"
)

// Key is a block's 64-bit key: the last 8 bytes, big-endian, of the engine's
// block digest. This is the form vLLM puts on the wire by default, so a key we
// compute from token ids and a hash an engine publishes compare directly.
type Key uint64

// PodID is an interned (pod name, data-parallel rank) pair. Two DP ranks of one
// pod are separate engines with separate caches, so they are separate PodIDs.
type PodID uint32

// ModelID is an interned model name.
type ModelID uint32

// Tier is the storage medium a cached block lives on.
type Tier uint8

const (
	TierGPU      Tier = iota // default when an event names no medium
	TierCPU                  // CPU, CPU_PINNED
	TierDisk                 // DISK, FS
	TierExternal             // OBJ, STORAGE, EXTERNAL and anything unknown
	NumTiers
)

var tierNames = [NumTiers]string{"gpu", "cpu", "disk", "external"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return "unknown"
}

// ParseTier normalises an engine's medium string. Missing means GPU; unknown
// media are treated as external storage rather than dropped.
func ParseTier(medium string) Tier {
	switch strings.ToUpper(medium) {
	case "", "GPU", "HBM", "CUDA":
		return TierGPU
	case "CPU", "CPU_PINNED", "DRAM":
		return TierCPU
	case "DISK", "FS", "SSD", "LOCAL_DISK":
		return TierDisk
	default:
		return TierExternal
	}
}

// TierByName parses the lower-case names used in configuration ("gpu", "cpu", ...).
func TierByName(name string) (Tier, bool) {
	for i, n := range tierNames {
		if n == strings.ToLower(name) {
			return Tier(i), true
		}
	}
	return 0, false
}

// Holder is one pod holding one block: which pod (with its DP rank, through
// PodID), on which tier, in which KV-cache group (hybrid models).
type Holder struct {
	Pod   PodID
	Tier  Tier
	Group uint8
}

// Visitor receives the holders of each looked-up key in order. holders is only
// valid during the call. Returning false stops the lookup. Visitor is an
// interface (not a func) so the scorer can pass a pointer without allocating.
type Visitor interface {
	Visit(i int, key Key, holders []Holder) bool
}

// IndexStats are the counters an index exposes for metrics.
type IndexStats struct {
	Entries   int64 // (block, holder) entries currently held
	Keys      int64 // distinct (model, key) entries
	Evictions int64 // entries dropped because the capacity bound was reached
	Expired   int64 // entries dropped by a TTL (Redis safety net)
}

// Index maps (model, block key) to the pods holding that block. Every method is
// safe for concurrent use.
type Index interface {
	// Add records that pod holds keys on tier/group.
	Add(ctx context.Context, model ModelID, pod PodID, tier Tier, group uint8, keys []Key) error
	// Remove forgets that pod holds keys on tier/group. Unknown keys are ignored.
	Remove(ctx context.Context, model ModelID, pod PodID, tier Tier, group uint8, keys []Key) error
	// ClearPod forgets everything pod holds, in O(1) (epochs), not a scan.
	ClearPod(ctx context.Context, pod PodID) error
	// Lookup calls v.Visit for keys[0], keys[1], ... in order with each key's
	// live holders, stopping when Visit returns false or a key has no holder.
	Lookup(ctx context.Context, model ModelID, keys []Key, v Visitor) error
	// PodBlocks is how many blocks pod currently holds (all tiers).
	PodBlocks(ctx context.Context, pod PodID) (int64, error)
	// Stats returns the index counters.
	Stats() IndexStats
}

// Engine is the kind of engine publishing a stream; it decides how hashes on
// the wire are normalised and whether our own hashing can reproduce them.
type Engine uint8

const (
	EngineVLLM Engine = iota
	EngineSGLang
)

func (e Engine) String() string {
	if e == EngineSGLang {
		return "sglang"
	}
	return "vllm"
}

// ParseEngine accepts "vllm" (default for "") and "sglang".
func ParseEngine(s string) (Engine, bool) {
	switch strings.ToLower(s) {
	case "", "vllm":
		return EngineVLLM, true
	case "sglang":
		return EngineSGLang, true
	}
	return 0, false
}

// EventKind is the type of one KV-cache event.
type EventKind uint8

const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "block_stored"
	case BlockRemoved:
		return "block_removed"
	case AllBlocksCleared:
		return "all_blocks_cleared"
	}
	return "unknown"
}

// Event is one decoded, engine-neutral KV-cache event. Hashes are already
// normalised to uint64 by the decoder (see kvevents).
type Event struct {
	Kind        EventKind
	BlockHashes []uint64
	ParentHash  uint64
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	LoraID      int64
	HasLoraID   bool
	LoraName    string
	Medium      Tier
	// ExtraKeys has one entry per block (nil when the engine sent none). Each
	// entry is the block's extra-keys tuple exactly as the engine hashed it:
	// string, int64, []byte and []any (tuples) values.
	ExtraKeys [][]any
	GroupIdx  int
	CacheSalt string // SGLang's salted requests
}

// Batch is one message from one engine: its events apply in order.
type Batch struct {
	Pod       string
	Model     string
	DPRank    int
	Engine    Engine
	Seq       uint64
	Timestamp float64 // engine's wall clock, seconds
	Events    []Event
}

// BatchSink consumes decoded batches. kvevents calls Apply for a given pod
// from one goroutine at a time, in the order the engine published them. ctx
// ends when the subscriber shuts down, so index writes (Redis) can be
// cancelled instead of outliving the daemon.
type BatchSink interface {
	Apply(ctx context.Context, b *Batch)
}

// PodBlocksBatcher is implemented by index backends that can answer
// PodBlocks for many pods at once much cheaper than one call per pod (Redis:
// one round trip instead of one per pod). Pod listings use it when the index
// has it and fall back to PodBlocks otherwise. PodBlocksBatch sets out[i] to
// what PodBlocks(pods[i]) would return; callers pass len(out) == len(pods).
// On error the contents of out are unspecified.
type PodBlocksBatcher interface {
	PodBlocksBatch(ctx context.Context, pods []PodID, out []int64) error
}

// HealthChecker is implemented by index backends that can be unavailable
// (Redis). The daemon reports not-ready while Healthy returns an error.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}
