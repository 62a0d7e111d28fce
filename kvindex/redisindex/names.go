package redisindex

import (
	"context"
	"strings"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
)

var _ kvindex.SharedNames = (*Index)(nil)

// modelPrefixOf is "<ns>:b:<model>:" for a model name (see modelPrefix).
func (x *Index) modelPrefixOf(name string) string {
	if strings.ContainsAny(name, "{}%") {
		name = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(name)
	}
	return x.ns + ":b:" + name + ":"
}

// HasModelKey implements kvindex.SharedNames with one EXISTS of the block
// key: a daemon that never received an event for a model (restarted, or a
// score-only replica) learns from the shared index that another daemon
// wrote it. Asking for the request's first block is enough: when nobody
// holds it, nobody holds a prefix and the answer is empty anyway.
func (x *Index) HasModelKey(ctx context.Context, model string, key blockkeys.Key) (bool, error) {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	bk := blockKeys(nil, x.modelPrefixOf(model), []blockkeys.Key{key})
	n, err := x.c.Exists(ctx, bk[0]).Result()
	if err != nil {
		return false, unavailable("model lookup", err)
	}
	return n > 0, nil
}
