package indexer

import (
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/prometheus/client_golang/prometheus"
)

// keyCaches holds one request-path key cache per distinct key config (the
// default and each per-model override) and engine, so a prompt prefix that
// many requests share is hashed once. The map is built in New and read-only
// afterwards; a cache is allocated at its first use, so engines a fleet does
// not run cost nothing.
type keyCaches map[*blockkeys.Hasher]*keyCacheSlot

type keyCacheSlot struct {
	h       *blockkeys.Hasher
	entries int
	once    sync.Once
	c       atomic.Pointer[blockkeys.KeyCache]
}

func (s *keyCacheSlot) cache() *blockkeys.KeyCache {
	s.once.Do(func() { s.c.Store(blockkeys.NewKeyCache(s.h, s.entries)) })
	return s.c.Load()
}

// newKeyCaches sizes each cache to entries blocks; entries < 0 disables the
// caches (every request hashes all its blocks); New resolved 0 to the default.
func newKeyCaches(hashers *blockkeys.HasherSet, models map[string]blockkeys.KeyConfig, entries int) keyCaches {
	if entries < 0 {
		return nil
	}
	kc := keyCaches{}
	add := func(model string) {
		for e := blockkeys.Engine(0); e < blockkeys.NumEngines; e++ {
			if h := hashers.ForEngine(model, e); kc[h] == nil {
				kc[h] = &keyCacheSlot{h: h, entries: entries}
			}
		}
	}
	add("")
	for m := range models {
		add(m)
	}
	return kc
}

// keys appends the keys of tokens under h, through h's cache when it has one.
func (kc keyCaches) keys(h *blockkeys.Hasher, dst []blockkeys.Key, tokens []uint32, ix blockkeys.RequestExtras) []blockkeys.Key {
	dst, _ = kc.keysHits(h, dst, tokens, ix)
	return dst
}

// keysHits is keys that also returns how many keys the cache held.
func (kc keyCaches) keysHits(h *blockkeys.Hasher, dst []blockkeys.Key, tokens []uint32, ix blockkeys.RequestExtras) ([]blockkeys.Key, int) {
	if s := kc[h]; s != nil {
		return s.cache().KeysHits(dst, tokens, ix)
	}
	return h.Keys(dst, tokens, ix), 0
}

func (kc keyCaches) stats() (s blockkeys.KeyCacheStats) {
	for _, slot := range kc {
		c := slot.c.Load()
		if c == nil {
			continue
		}
		st := c.Stats()
		s.Capacity += st.Capacity
		s.Hits += st.Hits
		s.Misses += st.Misses
		s.Evictions += st.Evictions
	}
	return s
}

var (
	descKeyCacheCapacity  = prometheus.NewDesc("kvindexd_key_cache_capacity_blocks", "Blocks the request-path key caches can hold (all key configs).", nil, nil)
	descKeyCacheHits      = prometheus.NewDesc("kvindexd_key_cache_hits_total", "Request blocks whose key came from the key cache (not re-hashed).", nil, nil)
	descKeyCacheMisses    = prometheus.NewDesc("kvindexd_key_cache_misses_total", "Request blocks hashed because the key cache did not hold them.", nil, nil)
	descKeyCacheEvictions = prometheus.NewDesc("kvindexd_key_cache_evictions_total", "Key cache entries replaced at the capacity bound.", nil, nil)
)

// keyCacheCollector reads the key caches' counters at scrape time.
type keyCacheCollector struct{ kc keyCaches }

func (c keyCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descKeyCacheCapacity
	ch <- descKeyCacheHits
	ch <- descKeyCacheMisses
	ch <- descKeyCacheEvictions
}

func (c keyCacheCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.kc.stats()
	ch <- prometheus.MustNewConstMetric(descKeyCacheCapacity, prometheus.GaugeValue, float64(s.Capacity))
	ch <- prometheus.MustNewConstMetric(descKeyCacheHits, prometheus.CounterValue, float64(s.Hits))
	ch <- prometheus.MustNewConstMetric(descKeyCacheMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(descKeyCacheEvictions, prometheus.CounterValue, float64(s.Evictions))
}
