package kvindex_test

import (
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/kvindex"
)

// The memory index passes the same conformance suite as every other
// backend (the Redis one runs it in kvindex/redisindex).
func TestConformanceMemory(t *testing.T) {
	indextest.Run(t, func(*testing.T, *kvindex.Interner) kvindex.Index {
		return kvindex.NewMemoryIndex(kvindex.MemoryConfig{})
	})
}
