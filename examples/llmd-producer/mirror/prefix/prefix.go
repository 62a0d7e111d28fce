// Package prefix mirrors llm-d-router's
// pkg/epp/framework/plugins/datalayer/attribute/prefix (data_types.go) at
// ebab687927f5331c1b39defcb579a07951bce56c (see package mirror).
package prefix

import (
	"maps"

	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/datalayer"
	"github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"
)

// PrefixCacheMatchInfoDataKey is the key prefix producers publish under;
// each producer binds it to its instance name, and consumers select one
// with prefixMatchInfoProducerName. The default producer is the
// approximate one.
var PrefixCacheMatchInfoDataKey = plugin.NewDataKey("PrefixCacheMatchInfoDataKey", "approx-prefix-cache-producer")

// SpeculativeTierKey is the CachedBlocksByTier key of speculative entries.
const SpeculativeTierKey = "speculative"

// PrefixCacheMatchInfo is one endpoint's match of the request's prefix.
type PrefixCacheMatchInfo struct {
	matchBlocks        int
	totalBlocks        int
	blockSizeTokens    int
	cachedBlockCount   int
	cachedBlocksByTier map[string]int
	mm                 *MMMatchInfo
}

// MMMatchInfo is the multimodal part of a match.
type MMMatchInfo struct {
	MatchBlocks int
}

// NewPrefixCacheMatchInfo: matchBlocks is the (tier-weighted, for precise
// producers) match, totalBlocks the request's blocks; CachedBlockCount
// defaults to matchBlocks.
func NewPrefixCacheMatchInfo(matchBlocks, totalBlocks, blockSizeTokens int) *PrefixCacheMatchInfo {
	return &PrefixCacheMatchInfo{matchBlocks: matchBlocks, totalBlocks: totalBlocks,
		blockSizeTokens: blockSizeTokens, cachedBlockCount: matchBlocks}
}

// WithCachedBlockCount sets the unweighted contiguous cached-block count.
func (p *PrefixCacheMatchInfo) WithCachedBlockCount(n int) *PrefixCacheMatchInfo {
	p.cachedBlockCount = n
	return p
}

// WithMM attaches the multimodal match.
func (p *PrefixCacheMatchInfo) WithMM(mm MMMatchInfo) *PrefixCacheMatchInfo {
	p.mm = &mm
	return p
}

// WithCachedBlocksByTier sets the per-tier counts and takes the map.
func (p *PrefixCacheMatchInfo) WithCachedBlocksByTier(m map[string]int) *PrefixCacheMatchInfo {
	p.cachedBlocksByTier = m
	return p
}

func (p *PrefixCacheMatchInfo) MatchBlocks() int     { return p.matchBlocks }
func (p *PrefixCacheMatchInfo) TotalBlocks() int     { return p.totalBlocks }
func (p *PrefixCacheMatchInfo) BlockSizeTokens() int { return p.blockSizeTokens }
func (p *PrefixCacheMatchInfo) MM() *MMMatchInfo     { return p.mm }

// CachedBlockCount is the unweighted contiguous cached-block count.
func (p *PrefixCacheMatchInfo) CachedBlockCount() int { return p.cachedBlockCount }

// CachedBlocksByTier is the per-tier breakdown; nil = no tier data.
func (p *PrefixCacheMatchInfo) CachedBlocksByTier() map[string]int { return p.cachedBlocksByTier }

// Clone implements datalayer.Cloneable.
func (p *PrefixCacheMatchInfo) Clone() datalayer.Cloneable {
	c := &PrefixCacheMatchInfo{matchBlocks: p.matchBlocks, totalBlocks: p.totalBlocks,
		blockSizeTokens: p.blockSizeTokens, cachedBlockCount: p.cachedBlockCount,
		cachedBlocksByTier: maps.Clone(p.cachedBlocksByTier)}
	if p.mm != nil {
		mm := *p.mm
		c.mm = &mm
	}
	return c
}
