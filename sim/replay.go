package sim

import (
	"encoding/json"

	"github.com/kvindex/kvindex/sim/cache"
)

// ReplayResult is the JSON object `kvsim replay` prints; field order is the
// order docs/simulator.md lists.
type ReplayResult struct {
	Policy            string  `json:"policy"`
	Capacity          int     `json:"capacity"`
	BlockSize         int     `json:"block_size"`
	Requests          int     `json:"requests"`
	TotalPromptTokens int64   `json:"total_prompt_tokens"`
	TotalHitTokens    int64   `json:"total_hit_tokens"`
	OverallHitRate    float64 `json:"overall_hit_rate"`
	FinalCacheBlocks  int     `json:"final_cache_blocks"`
	// PerRequest is filled only when asked for; it is then always printed
	// (an empty trace gives []), which omitempty could not express, so
	// MarshalJSON handles it.
	PerRequest []requestResult `json:"-"`
}

// MarshalJSON prints per_request exactly when PerRequest is non-nil.
func (r ReplayResult) MarshalJSON() ([]byte, error) {
	type plain ReplayResult // no methods: no recursion
	if r.PerRequest == nil {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		plain
		PerRequest []requestResult `json:"per_request"`
	}{plain(r), r.PerRequest})
}

// requestResult is one entry of per_request.
type requestResult struct {
	PromptTokens int `json:"prompt_tokens"`
	HitTokens    int `json:"hit_tokens"`
}

// prefixHit returns k, the number of leading hash_ids resident in p (scan from
// index 0, stop at the first miss: longest prefix, not set intersection), and
// the hit tokens min(k*blockSize, inputLength) (the last block is usually
// partial, so k*blockSize alone would overcount).
func prefixHit(p cache.Policy, r *Request, blockSize int) (k, hitTokens int) {
	for k < len(r.HashIDs) && p.Contains(r.HashIDs[k]) {
		k++
	}
	return k, min(k*blockSize, r.InputLength)
}

// Replay runs every request against one cache: prefix hit first, then every
// hash of the request (hit or miss) is accessed in order.
func Replay(reqs []Request, p cache.Policy, blockSize int, perRequest bool) ReplayResult {
	res := ReplayResult{Policy: p.Name(), Capacity: p.Capacity(), BlockSize: blockSize, Requests: len(reqs)}
	if perRequest {
		res.PerRequest = make([]requestResult, 0, len(reqs))
	}
	var scratch []uint64
	for i := range reqs {
		r := &reqs[i]
		_, hit := prefixHit(p, r, blockSize)
		for _, h := range r.HashIDs {
			scratch = p.Access(h, scratch[:0])
		}
		res.TotalPromptTokens += int64(r.InputLength)
		res.TotalHitTokens += int64(hit)
		if perRequest {
			res.PerRequest = append(res.PerRequest, requestResult{PromptTokens: r.InputLength, HitTokens: hit})
		}
	}
	if res.TotalPromptTokens > 0 {
		res.OverallHitRate = float64(res.TotalHitTokens) / float64(res.TotalPromptTokens)
	}
	res.FinalCacheBlocks = p.Len()
	return res
}

// unboundedHitRate is the ceiling: every block ever seen stays resident.
func unboundedHitRate(reqs []Request, blockSize int) (hit, total int64) {
	seen := make(map[uint64]struct{})
	for i := range reqs {
		r := &reqs[i]
		k := 0
		for k < len(r.HashIDs) {
			if _, ok := seen[r.HashIDs[k]]; !ok {
				break
			}
			k++
		}
		hit += int64(min(k*blockSize, r.InputLength))
		total += int64(r.InputLength)
		for _, h := range r.HashIDs {
			seen[h] = struct{}{}
		}
	}
	return hit, total
}
