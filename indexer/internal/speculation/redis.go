// Package speculation keeps Pick's speculative entries in Redis, so every
// daemon serving one Redis index sees the picks of the others: a burst of
// identical requests spread over several daemons still lands on one pod
// before that pod's events arrive.
//
// One key per (model, block) holds the latest pick's holder with a PX TTL:
// "<namespace>:spec:<model hash>:<block key>" = 8-byte holder id. Keys carry
// no hash tag, so they spread over a Cluster's slots; every operation is a
// pipeline of single-key commands, which go-redis splits per node.
//
// The concept, its interface (indexer.SpeculativeStore) and the in-process
// store are in package indexer (speculation*.go); this package holds only
// the Redis store, which keeps the Redis client out of package indexer.
package speculation

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/redis/go-redis/v9"
	"github.com/zeebo/xxh3"
)

// window is how many blocks one Extend round trip reads; a speculative run
// longer than that costs another round trip.
const window = 512

// dropScript deletes a key only if it still names the holder: another
// pod's later pick of the same block must survive this pod's event.
// It takes two holders (a pod named with and without its rank: the router
// may have picked either), so one event costs one script run.
var dropScript = redis.NewScript(`local v = redis.call('GET', KEYS[1]) if v == ARGV[1] or v == ARGV[2] then return redis.call('DEL', KEYS[1]) end return 0`)

// RedisStore implements indexer.SpeculativeStore in Redis.
type RedisStore struct {
	client redis.UniversalClient
	ns     string
	ttl    time.Duration
	// dropLoaded: dropScript is known to the servers, so Drop is one
	// pipeline (a round trip per node) of EVALSHA. It is cleared when a
	// server answers NOSCRIPT (restarted, SCRIPT FLUSH, a new Cluster node).
	dropLoaded atomic.Bool
}

// NewRedis returns a store on c under namespace ns whose entries live ttl.
func NewRedis(c redis.UniversalClient, ns string, ttl time.Duration) (*RedisStore, error) {
	if c == nil || ttl < time.Millisecond {
		return nil, errors.New("speculation: need a client and a TTL of at least 1ms")
	}
	return &RedisStore{client: c, ns: ns, ttl: ttl}, nil
}

func (s *RedisStore) key(model uint64, k blockkeys.Key) string {
	b := make([]byte, 0, len(s.ns)+6+16+1+16)
	b = append(b, s.ns...)
	b = append(b, ":spec:"...)
	b = strconv.AppendUint(b, model, 16)
	b = append(b, ':')
	b = strconv.AppendUint(b, uint64(k), 16)
	return string(b)
}

func holderValue(h uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h)
	return string(b[:])
}

// Hold records holder for keys with the TTL.
func (s *RedisStore) Hold(ctx context.Context, model string, keys []blockkeys.Key, holder uint64) error {
	if len(keys) == 0 {
		return nil
	}
	m, v := xxh3.HashString(model), holderValue(holder)
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Set(ctx, s.key(m, k), v, s.ttl)
		}
		return nil
	})
	return err
}

// Drop removes the entries of keys that name either holder: one round trip
// per node once the script is loaded.
func (s *RedisStore) Drop(ctx context.Context, model string, keys []blockkeys.Key, holders [2]uint64) error {
	if len(keys) == 0 {
		return nil
	}
	m := xxh3.HashString(model)
	v0, v1 := holderValue(holders[0]), holderValue(holders[1])
	for attempt := 0; ; attempt++ {
		if !s.dropLoaded.Load() {
			// SCRIPT LOAD reaches every master of a Cluster
			if err := dropScript.Load(ctx, s.client).Err(); err != nil {
				return err
			}
			s.dropLoaded.Store(true)
		}
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				dropScript.EvalSha(ctx, p, []string{s.key(m, k)}, v0, v1)
			}
			return nil
		})
		if err == nil || attempt > 0 || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return err
		}
		s.dropLoaded.Store(false)
	}
}

// Extend sets ext[i] to how many blocks from keys[start[i]] holders[i]
// holds, reading the keys window by window from the earliest open run.
func (s *RedisStore) Extend(ctx context.Context, model string, keys []blockkeys.Key, holders []uint64, start, ext []int32) error {
	m := xxh3.HashString(model)
	open := make([]bool, len(holders))
	want := make([]string, len(holders))
	for i := range holders {
		ext[i] = 0
		open[i] = int(start[i]) < len(keys)
		want[i] = holderValue(holders[i])
	}
	cmds := make([]*redis.StringCmd, 0, window)
	for {
		lo := len(keys)
		for i := range holders {
			if open[i] {
				lo = min(lo, int(start[i]+ext[i]))
			}
		}
		if lo >= len(keys) {
			return nil
		}
		hi := min(lo+window, len(keys))
		cmds = cmds[:0]
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k := lo; k < hi; k++ {
				cmds = append(cmds, p.Get(ctx, s.key(m, keys[k])))
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i := range holders {
			if !open[i] {
				continue
			}
			for cur := int(start[i] + ext[i]); ; cur++ {
				if cur >= hi {
					open[i] = cur < len(keys)
					break
				}
				if v, err := cmds[cur-lo].Result(); err != nil || v != want[i] {
					open[i] = false
					break
				}
				ext[i]++
			}
		}
	}
}
