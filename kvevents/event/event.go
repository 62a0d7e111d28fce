package event

import (
	"context"
	"strings"

	"github.com/kvindex/kvindex/blockkeys"
)

// Tier is the storage medium a cached block lives on.
type Tier uint8

const (
	TierGPU      Tier = iota // default when an event names no medium
	TierCPU                  // host memory, pinned or not
	TierDisk                 // local disk or file system of the pod
	TierExternal             // shared, remote or object storage, and anything unknown
	// TierShared is a block another publisher (a storage tier such as
	// llm-d's filesystem offload connector) holds where this pod can load
	// it from. It is never stored in an index: the indexer credits it at
	// query time to the storage's readers (indexer/storage.go), so a
	// storage block costs one holder, not one per reader.
	TierShared
	NumTiers
)

// NumStoredTiers bounds the tiers an Index stores (a holder word packs the
// tier in 2 bits); TierShared and later tiers exist only in scores.
const NumStoredTiers = TierShared

var tierNames = [NumTiers]string{"gpu", "cpu", "disk", "external", "shared"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return "unknown"
}

// MediumTiers is the one table from the medium strings engines and KV
// connectors publish to a Tier. Keys are upper case; ParseTier folds case.
// Every entry is a decision, not a default:
//
//   - gpu: the engine's own device cache (vLLM "GPU"; "HBM", "CUDA",
//     "DEVICE", "XPU", "NPU" from other accelerators' ports).
//   - cpu: host memory of the same pod: vLLM's CPU offloading ("CPU",
//     "CPU_PINNED"), SGLang's HiCache L2 ("CPU_PINNED"; "CPU_TIER1" in the
//     tiered events of sgl-project/sglang PR #18205: host memory, written by
//     write_backup, removed by evict_host), LMCache's "LocalCPUBackend",
//     "DRAM", "HOST".
//   - disk: storage local to the pod: "DISK", "FS", "SSD", "NVME",
//     "LOCAL_DISK", LMCache's "LocalDiskBackend", "GDS".
//   - external: storage other pods can read too, so holding a block there
//     says little about this pod: "STORAGE", "SHARED_STORAGE",
//     "OBJECT_STORE", "OBJ", "EXTERNAL" (SGLang's L4, e.g. Mooncake), "REMOTE",
//     LMCache's "RemoteBackend", "P2P", "MOONCAKE", "S3", and SGLang's
//     "CPU_TIER2" (PR #18205: HiCache L3, written by write_backup_storage to
//     the storage backend, Mooncake, 3FS, NIXL or AIBrix, never removed by
//     an event: the name says CPU, the medium is that shared storage).
//
// A medium missing from the table is external (never dropped, never counted
// as the pod's GPU cache); the decoder counts it as unknown.
var MediumTiers = map[string]Tier{
	"GPU": TierGPU, "HBM": TierGPU, "CUDA": TierGPU, "DEVICE": TierGPU, "XPU": TierGPU, "NPU": TierGPU,
	"CPU": TierCPU, "CPU_PINNED": TierCPU, "DRAM": TierCPU, "HOST": TierCPU, "LOCALCPUBACKEND": TierCPU,
	"CPU_TIER1": TierCPU,
	"DISK":      TierDisk, "FS": TierDisk, "SSD": TierDisk, "NVME": TierDisk, "LOCAL_DISK": TierDisk,
	"LOCALDISKBACKEND": TierDisk, "GDS": TierDisk,
	"STORAGE": TierExternal, "SHARED_STORAGE": TierExternal, "OBJECT_STORE": TierExternal, "OBJ": TierExternal,
	"EXTERNAL": TierExternal, "REMOTE": TierExternal, "REMOTEBACKEND": TierExternal, "P2P": TierExternal,
	"MOONCAKE": TierExternal, "S3": TierExternal, "CPU_TIER2": TierExternal,
}

// ParseTier normalises an engine's medium string. Missing ("") means GPU;
// see MediumTiers for the rest.
func ParseTier(medium string) Tier {
	t, _ := LookupTier(medium)
	return t
}

// LookupTier is ParseTier that also reports whether the medium is in
// MediumTiers ("" counts as known: it is the GPU default).
func LookupTier(medium string) (Tier, bool) {
	if medium == "" {
		return TierGPU, true
	}
	if t, ok := MediumTiers[strings.ToUpper(medium)]; ok {
		return t, true
	}
	return TierExternal, false
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

// Kind is the type of one KV-cache event.
type Kind uint8

const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
	// BlockSnapshot is the pod's whole state at one point (SGLang's
	// snapshot protocol): exactly BlockHashes are cached, nothing else. No
	// engine sends it as an event; kvevents builds it from a snapshot reply.
	// A large one reaches the sink in parts (Event.SnapshotPart).
	BlockSnapshot
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "block_stored"
	case BlockRemoved:
		return "block_removed"
	case AllBlocksCleared:
		return "all_blocks_cleared"
	case BlockSnapshot:
		return "block_snapshot"
	}
	return "unknown"
}

// GroupKind is the attention kind of a KV-cache group (hybrid models publish
// kv_cache_spec_kind). It decides whether a group's blocks bound a prefix
// match: only full-attention groups do.
type GroupKind uint8

const (
	// GroupKindUnknown: the event did not say. A group never described is
	// treated as full attention (older engines with one group).
	GroupKindUnknown GroupKind = iota
	GroupFullAttention
	// GroupSlidingWindow drops blocks outside its window on purpose; its
	// removals must not shorten a match.
	GroupSlidingWindow
	// GroupMamba keeps state, not per-token KV: its blocks say nothing of a
	// prefix's attention KV.
	GroupMamba
	// GroupOther: chunked-local, encoder-only, cross attention and kinds not
	// known yet. Like sliding windows they do not bound a match.
	GroupOther
)

var groupKindNames = [...]string{"unknown", "full_attention", "sliding_window", "mamba", "other"}

func (k GroupKind) String() string {
	if int(k) < len(groupKindNames) {
		return groupKindNames[k]
	}
	return "unknown"
}

// ParseGroupKind maps vLLM's KVCacheSpecKind values (and SGLang's component
// types) to a GroupKind. "" is GroupKindUnknown.
func ParseGroupKind(s string) GroupKind {
	switch strings.ToLower(s) {
	case "":
		return GroupKindUnknown
	case "full_attention", "full", "mla_attention", "sink_full_attention", "attention", "mha", "mla":
		return GroupFullAttention
	case "sliding_window", "sliding_window_mla", "swa":
		return GroupSlidingWindow
	case "mamba", "mamba2", "linear_attention", "ssm":
		return GroupMamba
	}
	return GroupOther
}

// OpaqueExtraKey stands in an extra-keys tuple for a value the decoder could
// read but not interpret (an unknown tagged key, a float, a map): the block
// is still indexed, under the engine's hash, and counted as unverified.
type OpaqueExtraKey struct{ What string }

// Event is one decoded, engine-neutral KV-cache event. Hashes are already
// normalised to uint64 by the decoder (see kvevents). Which engine versions
// send which fields: docs/wire-formats.md.
type Event struct {
	Kind        Kind
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
	// string, int64, bool, nil, []byte and []any (tuples) values, or an
	// OpaqueExtraKey for a value that cannot be reproduced.
	ExtraKeys [][]any
	GroupIdx  int
	CacheSalt string // SGLang's salted requests
	// GroupKind and SlidingWindow are kv_cache_spec_kind and
	// kv_cache_spec_sliding_window (BlockStored of hybrid models).
	GroupKind     GroupKind
	SlidingWindow int
	// Remote is locality "REMOTE": the blocks are held for this pod
	// elsewhere (another pod's cache, a shared pool), not in its own cache.
	Remote bool
	// Ownership is the publisher's ownership tag, carried as sent.
	Ownership string
	// SessionID is vLLM's BlockStored.session_id (PR #51381): the session
	// of the request that stored or reused the blocks; "" when not sent.
	SessionID string
	// RemainingCopies is BlockRemoved.remaining_copy_counts, one per hash:
	// how many physical copies of that hash the engine still holds after
	// this removal. HasRemainingCopies is false when the engine sent none.
	RemainingCopies    []uint32
	HasRemainingCopies bool
	// SnapshotPart marks a BlockSnapshot that continues the one before it:
	// kvevents applies a large snapshot in turns of its apply worker (so
	// other pods' batches on that worker are not held behind all of it),
	// the first turn as the BlockSnapshot, which replaces the pod's state,
	// the later ones with this set, whose records are added to what the
	// first turns put in. It is never set on a decoded engine event.
	SnapshotPart bool
	// Bigram: the engine sent token pairs (SGLang with EAGLE speculative
	// decoding: each position as [t_i, t_i+1]); TokenIDs then holds the
	// pairs flattened, two ids per position (t_i, t_i+1, t_i+1, t_i+2, ...),
	// the sequence SGLang hashes. BlockSize still counts positions.
	Bigram bool
}

// Batch is one message from one engine: its events apply in order.
type Batch struct {
	Pod       string
	Model     string
	DPRank    int
	Engine    blockkeys.Engine
	Seq       uint64
	Timestamp float64 // engine's wall clock, seconds
	Events    []Event
}

// Sink consumes decoded batches. kvevents calls Apply for a given pod
// from one goroutine at a time, in the order the engine published them. ctx
// ends when the subscriber shuts down, so index writes (Redis) can be
// cancelled instead of outliving the daemon.
//
// ForgetPod is part of the contract, not an optional extra: kvevents calls
// it on the pod's worker, behind the pod's last batches, after it expired a
// silent stream, and the sink drops every piece of state it holds for the
// pod (digest-cache holds, alias tables, statistics). A sink with nothing to
// drop implements it as a no-op; a wrapper must pass it on, which the
// compiler now checks instead of a type assertion that a wrapper could
// silently defeat.
//
// Apply reports, never decides, what the batch did to the pod's entries
// (ApplyOutcome); the caller owns what follows from it (kvevents records it
// in the pod's stream state, the one place that says whether the pod may be
// served).
type Sink interface {
	Apply(ctx context.Context, b *Batch) ApplyOutcome
	ForgetPod(ctx context.Context, pod string, dpRank int)
}

// ApplyOutcome is what Apply did to the pod's entries in the index.
//
// IndexFailed: a write of the pod's failed, in this batch or in the clear
// that had to precede it, so the index no longer holds what the pod's
// events say (entries written before a lost removal would be served as if
// still cached). It stays true for every batch until one whose clear
// succeeds: the sink clears such a pod before applying its next batch, and
// what the pod held before is then gone from the index, rebuilt from later
// events only.
type ApplyOutcome struct {
	IndexFailed bool
}

// MaxSessionIDLen bounds a session id the decoder keeps; a longer one is
// skipped as an unreadable field (counted), never fatal.
const MaxSessionIDLen = 256
