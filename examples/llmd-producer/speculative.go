package llmdproducer

import (
	"sync"
	"time"
)

// Speculative entries, as llm-d's producer keeps them. Upstream's PreRequest
// adds, for the chosen endpoint (and the "prefill" profile's in P/D), a
// speculative entry to its own in-process index for every block key of the
// request, and a TTL cache evicts the request's entries speculativeTTL
// later (prerequest.go: buildSpeculativeCache, PreRequest). Its Produce then
// reads them like any entry: under the "speculative" tier
// (utils.go: matchedBlockCountByTier), in the unweighted cached-block run
// (matchedBlockCount) and at weight 1 in the weighted match (the scorer's
// weight for a tier it has no weight for: kvblock_scorer.go fillMaxWeights).
// So the speculative tier is this producer's own record of where its
// PreRequest sent requests, not the daemon's (which also holds other
// routers' picks): specRecord is that record.
//
// An entry is one (block, endpoint) pair with an expiry. Upstream's index
// holds one speculative entry per (block, endpoint), and the first of the
// requests that added it to expire evicts it, even if a later request added
// the same one: so a live entry keeps the expiry it was created with.

// Defaults of the speculative record.
const (
	// DefaultSpeculativeTTL is upstream's defaultSpeculativeTTL.
	DefaultSpeculativeTTL = 2 * time.Second
	// DefaultMaxSpeculativeEntries caps the (block, endpoint) entries:
	// 2s of 64-block requests at 750 requests/s. Upstream's TTL cache
	// has no cap.
	DefaultMaxSpeculativeEntries = 100_000
)

type specKey struct {
	block uint64 // chained hash of the request's blocks up to this one
	pod   string
}

// specRecord is safe for concurrent use.
type specRecord struct {
	ttl  time.Duration
	max  int
	seed uint64
	now  func() time.Time

	mu        sync.Mutex
	entries   map[specKey]time.Time // expiry
	lastSweep time.Time
	dropped   uint64 // entries not recorded at the cap
}

func newSpecRecord(ttl time.Duration, max int, seed uint64) *specRecord {
	return &specRecord{ttl: ttl, max: max, seed: seed, now: time.Now, entries: map[specKey]time.Time{}}
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// keys appends the chained block hashes of tokens' full blocks: block i's
// hash covers model, salt and every token of blocks 0..i, as the engine's
// prefix-chained block hashes do, so two requests share block i's hash
// exactly when they share blocks 0..i. The hash is the producer's own
// (seeded FNV-1a): it only has to tell this producer's requests apart.
func (s *specRecord) keys(dst []uint64, model, salt string, tokens []uint32, blockSize int) []uint64 {
	h := uint64(fnvOffset) ^ s.seed
	for _, str := range []string{model, salt} {
		for i := 0; i < len(str); i++ {
			h = (h ^ uint64(str[i])) * fnvPrime
		}
		h = (h ^ 0xff) * fnvPrime // separator: ("ab","c") is not ("a","bc")
	}
	for b := 0; b+blockSize <= len(tokens); b += blockSize {
		for _, t := range tokens[b : b+blockSize] {
			h = (h ^ uint64(t)) * fnvPrime
			h = (h ^ uint64(t>>16)) * fnvPrime
		}
		dst = append(dst, h)
	}
	return dst
}

// record adds pod's entries for keys; live ones keep their expiry. At the
// cap, expired entries are swept (at most once per TTL/2, so a full record
// of live entries is not walked on every request) and what still does not
// fit is dropped and counted.
func (s *specRecord) record(pod string, keys []uint64) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		sk := specKey{k, pod}
		if exp, ok := s.entries[sk]; ok && exp.After(now) {
			continue
		} else if !ok && len(s.entries) >= s.max {
			if now.Sub(s.lastSweep) >= s.ttl/2 {
				s.lastSweep = now
				for k, exp := range s.entries {
					if !exp.After(now) {
						delete(s.entries, k)
					}
				}
			}
			if len(s.entries) >= s.max {
				s.dropped += uint64(len(keys) - i)
				return
			}
		}
		s.entries[sk] = now.Add(s.ttl)
	}
}

// run is pod's run of live speculative entries from block 0 of keys.
func (s *specRecord) run(pod string, keys []uint64) int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if exp, ok := s.entries[specKey{k, pod}]; !ok || !exp.After(now) {
			break
		}
		n++
	}
	return n
}

// stats returns the entries held (live or not yet swept) and dropped.
func (s *specRecord) stats() (entries int, dropped uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries), s.dropped
}
