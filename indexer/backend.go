package indexer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
)

// Backend is an index and the optional capabilities it has. Each capability
// is declared by the code that built the index, as a typed field, and the
// composition root hands it to the part that uses it: nothing downstream
// discovers a capability by a type assertion, so wrapping the index (the
// prediction check wraps the applier's view of it) can never switch one off
// unseen. A nil field means the backend does not have that capability, and
// a configuration that needs it is a start-up error (New).
type Backend struct {
	// Index is required.
	Index kvindex.Index
	// Health reports an unavailable backend (Redis); nil: it cannot fail.
	Health kvindex.HealthChecker
	// Names finds models other processes wrote (a shared index); nil: a
	// process-local index, where a name never interned holds nothing.
	Names kvindex.SharedNames
	// Batch answers PodBlocks for many pods at once; nil: one call per pod.
	Batch kvindex.PodBlocksBatcher
	// Prefix scores prefixes inside the index; nil: the scorer walks Lookup.
	Prefix kvindex.PrefixScorer
	// Share accounts entries per pod, for ApplierLimits.PodShare; nil: a
	// pod share is refused at start.
	Share applier.ShareAccounting
	// Held adds stored blocks reporting which keys the pod already held,
	// so the applier counts copies only for blocks stored again; nil: it
	// counts every block (applier.Config.Held).
	Held kvindex.HeldAdder
	// Lost registers the function the backend calls, with a reason, when it
	// finds it lost entries behind the daemon's back (Redis restarted,
	// evicted or was flushed); nil: it cannot. The indexer marks every
	// event stream incomplete then ("index_lost").
	Lost func(notify func(reason string))
	// Evicted appends the pods that lost entries to the backend's own
	// capacity bound since its last call (the memory index's
	// TakeEvicted); nil: it evicts nothing behind the daemon (Redis
	// reports through Lost). The indexer marks those pods' streams
	// incomplete ("evicted_for_capacity").
	Evicted func(dst []kvindex.PodID) []kvindex.PodID
	// Close releases what the backend holds; nil: nothing to release.
	Close func() error

	// The built-in backends' own types, for the features that need them:
	// snapshots need the memory index, leases and shared speculative
	// entries the Redis one. Set only by MemoryBackend and RedisBackend.
	memory *kvindex.MemoryIndex
	redis  *redisindex.Index
}

// BackendFunc builds a custom index backend on the interner the Indexer
// owns. It is a factory, not an Index, so that a backend that stores pod and
// model names can only ever be given the interner every other part uses.
type BackendFunc func(ctx context.Context, in *kvindex.Interner) (Backend, error)

// MemoryBackend is the in-process index with every capability it has.
func MemoryBackend(m *kvindex.MemoryIndex) Backend {
	return Backend{Index: m, Prefix: m, Share: m, Held: m, Evicted: m.TakeEvicted, memory: m}
}

// RedisBackend is the shared Redis index with every capability it has. It
// has no per-pod share accounting: Redis bounds its memory itself.
func RedisBackend(r *redisindex.Index) Backend {
	return Backend{Index: r, Health: r, Names: r, Batch: r, Lost: r.OnLost, Close: r.Close, redis: r}
}

// IndexConfig selects and bounds the built-in index backend.
type IndexConfig struct {
	// Redis, when set, keeps the index in Redis, shared by every daemon
	// on the same namespace; its Interner is set by New. nil = in memory.
	Redis *redisindex.Config
	// Capacity bounds the in-memory index in (block, pod) entries
	// (kvindex.MemoryOptions.Capacity; 0 = its default). Not used with Redis.
	Capacity int64
}

// buildBackend returns the custom backend when one is configured, else the
// built-in one IndexConfig selects.
func buildBackend(ctx context.Context, cfg Config, in *kvindex.Interner, log *slog.Logger) (Backend, error) {
	if cfg.Backend != nil {
		b, err := cfg.Backend(ctx, in)
		if err != nil {
			return Backend{}, err
		}
		if b.Index == nil {
			return Backend{}, errors.New("indexer: backend factory returned no index")
		}
		return b, nil
	}
	if cfg.Index.Redis == nil {
		mem := kvindex.NewMemoryIndex(kvindex.MemoryConfig{Capacity: cfg.Index.Capacity})
		log.Info("index: in-memory", "capacity_entries", mem.Capacity())
		return MemoryBackend(mem), nil
	}
	rc := *cfg.Index.Redis
	rc.Interner = in
	if rc.Logger == nil {
		rc.Logger = log.With("component", "redisindex")
	}
	if cfg.Tracer.On() && rc.NodeHook == nil {
		rc.NodeHook = cfg.Tracer.RedisHook
	}
	r, err := redisindex.New(ctx, rc)
	if err != nil {
		return Backend{}, fmt.Errorf("index: %w", err)
	}
	log.Info("index: redis", "namespace", r.Namespace())
	return RedisBackend(r), nil
}
