package indexer

import (
	"time"

	"github.com/kvindex/kvindex/indexer/internal/redisspec"
)

// sharedSpeculative is the store speculative entries are shared through:
// the Redis index's server, where every daemon on that index sees them;
// nil (in process) for any other backend.
func (x *Indexer) sharedSpeculative(ttl time.Duration) (SpeculativeStore, error) {
	r := x.backend.redis
	if r == nil {
		return nil, nil
	}
	return redisspec.New(r.Client(), r.Namespace(), ttl)
}
