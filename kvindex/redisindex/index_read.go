package redisindex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// PodBlocks is the number of distinct blocks pod holds (a block on two tiers
// counts once), as counted by the writers. Blocks dropped by the TTL are not
// subtracted.
func (x *Index) PodBlocks(ctx context.Context, pod kvindex.PodID) (int64, error) {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	n, err := x.c.HGet(ctx, x.podsKey, "n:"+x.podFieldOf(pod)).Int64()
	if err == redis.Nil {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("pod blocks", err)
	}
	return max(n, 0), nil
}

// PodBlocksBatch is PodBlocks for many pods in one round trip: every pod's
// counter lives in the one pods hash, so it is a single HMGET on the node
// holding it, whatever the number of pods (Cluster included).
func (x *Index) PodBlocksBatch(ctx context.Context, pods []kvindex.PodID, out []int64) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	if len(out) != len(pods) {
		return fmt.Errorf("redisindex: pod blocks: %d pods but room for %d results", len(pods), len(out))
	}
	if len(pods) == 0 {
		return nil
	}
	fields := make([]string, len(pods))
	for i, p := range pods {
		fields[i] = "n:" + x.podFieldOf(p)
	}
	vals, err := x.c.HMGet(ctx, x.podsKey, fields...).Result()
	if err != nil {
		return unavailable("pod blocks", err)
	}
	if len(vals) != len(pods) {
		return fmt.Errorf("redisindex: pod blocks: %d replies for %d pods", len(vals), len(pods))
	}
	for i, v := range vals {
		out[i] = 0
		s, ok := v.(string)
		if !ok { // nil: the pod never held a block
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			x.malformed.Add(1)
			continue
		}
		out[i] = max(n, 0)
	}
	return nil
}

type lookupBuf struct {
	bkeys   []string // views of kbuf, valid during one Lookup (clone to keep)
	kbuf    []byte
	skeys   []string
	args    []any    // MGET arguments: pointers into bkeys (boxing a pointer does not allocate)
	raw     rawReply // the MGET reply, raw RESP
	vals    [][]byte // block values (into raw or the GET replies), nil = no key
	gets    []*redis.StringCmd
	holders []kvindex.Holder
	fc      []fieldMemo
}

// fieldMemo is one field seen in this lookup: its holder and the current
// epoch of its pod. A prompt's keys share a handful of fields, so most
// records are resolved by comparing a short string with a few memos,
// without the shared caches' lock or map hashing.
type fieldMemo struct {
	field string
	h     kvindex.Holder
	epoch uint64
	ok    bool
}

const maxFieldMemos = 32

var lookupPool = sync.Pool{New: func() any { return &lookupBuf{} }}

// Lookup costs one round trip per Redis node: one pipeline of the pods hash
// version and the block values (one MGET on a single node; one GET per key
// on Cluster, split per node and sent in parallel by go-redis); the walk
// over the values judges each record against its pod's epoch and stops at
// the first key without a live holder or when v says so. With
// Config.ServerWalk on a single node, a script walks the keys server-side
// instead and stops reading at the first miss (lookupScripted).
func (x *Index) Lookup(ctx context.Context, model kvindex.ModelID, keys []blockkeys.Key, v kvindex.Visitor) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	if len(keys) == 0 {
		return nil
	}
	b := lookupPool.Get().(*lookupBuf)
	defer lookupPool.Put(b)
	if x.serverWalk {
		return x.lookupScripted(ctx, b, model, keys, v)
	}
	b.bkeys, b.kbuf = blockKeysInto(b.bkeys[:0], b.kbuf, x.modelPrefix(model), keys)
	if err := x.readValues(ctx, b); err != nil {
		return unavailable("lookup", err)
	}
	x.emu.RLock()
	epochs := x.epochs
	x.emu.RUnlock()
	b.fc = b.fc[:0]
	visiting := true
	var prev []byte // previous value parsed, and whether all of it was live and well-formed
	prevClean := false
	for i, val := range b.vals {
		if !visiting && len(val) == 0 {
			continue
		}
		if len(val) > 0 && prevClean && bytes.Equal(val, prev) {
			// Same bytes as the previous block (consecutive blocks of a
			// warm prefix usually have the same holders): the same live
			// holders, already sorted. Visitors only read holders.
		} else {
			clean := true
			b.holders = b.holders[:0]
			for pos, r := 0, 0; pos < len(val); r++ {
				f, e, next, ok := nextRecord(val, pos)
				if !ok {
					x.malformed.Add(1)
					clean = false
					break
				}
				pos = next
				m := b.memo(x, f, r, epochs)
				if !m.ok {
					x.malformed.Add(1)
					clean = false
					continue
				}
				if e < m.epoch {
					// Written before the pod's last clear: stale. Queue
					// a compare-and-delete; if the queue is full the TTL
					// or a later reader gets it.
					select {
					case x.cleanup <- cleanupItem{key: strings.Clone(b.bkeys[i]), field: string(f), value: strconv.FormatUint(e, 10)}:
					default:
					}
					clean = false
					continue
				}
				b.holders = append(b.holders, m.h)
			}
			sortHolders(b.holders)
			prev, prevClean = val, clean
		}
		if !visiting {
			// Past the end of the walk the values are already here:
			// only collect their stale entries for cleanup.
			continue
		}
		if len(b.holders) == 0 {
			visiting = false
			continue
		}
		if !v.Visit(i, keys[i], b.holders) {
			visiting = false
		}
	}
	clear(b.vals) // do not keep the replies alive in the pool
	clear(b.fc)
	clear(b.bkeys)
	if cap(b.raw.b) > maxPooledReply {
		b.raw.b = nil
	}
	if cap(b.kbuf) > maxPooledReply {
		b.kbuf = nil
	}
	return nil
}

// maxPooledReply: a pooled lookup keeps a reply (or key) buffer up to this
// size (a 512-key, 8-pod prompt needs ~100 KiB); larger ones are dropped.
const maxPooledReply = 1 << 20

// memo resolves field f, the r-th record of its value, through the
// lookup's memos, then the shared cache. Writers append records, so
// consecutive blocks usually list their holders in the same order: memo r
// is tried first.
func (b *lookupBuf) memo(x *Index, f []byte, r int, epochs map[kvindex.PodID]uint64) *fieldMemo {
	if r < len(b.fc) && b.fc[r].field == string(f) {
		return &b.fc[r]
	}
	for i := range b.fc {
		if b.fc[i].field == string(f) {
			return &b.fc[i]
		}
	}
	fs := string(f)
	h, ok := x.parseField(fs)
	m := fieldMemo{field: fs, h: h, ok: ok}
	if ok {
		m.epoch = epochs[h.Pod]
	}
	if len(b.fc) < maxFieldMemos {
		b.fc = append(b.fc, m)
		return &b.fc[len(b.fc)-1]
	}
	b.fc = append(b.fc[:0], m) // a prompt with unusually many holders: start over
	return &b.fc[0]
}

// readValues fetches the values of b.bkeys into b.vals in one pipeline
// with the pods hash version, and brings the epoch cache up to date. Every
// reply is checked before anything is visited: a partial answer (one
// Cluster node down) is an error, never a silently shorter prefix.
//
// On a single node the values come from one MGET read as raw RESP into a
// pooled buffer and split in place: go-redis' generic reply parsing costs
// two allocations per key (a string and its interface box), which was most
// of a warm lookup's client time.
func (x *Index) readValues(ctx context.Context, b *lookupBuf) error {
	b.vals = b.vals[:0]
	if x.cluster {
		return x.readValuesCluster(ctx, b)
	}
	b.args = append(b.args[:0], "mget")
	for i := range b.bkeys {
		b.args = append(b.args, &b.bkeys[i])
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		pipe := x.c.Pipeline()
		verCmd := pipe.HGet(ctx, x.podsKey, "_v")
		b.raw.b = b.raw.b[:0]
		mget := redis.NewRawWriteToCmd(ctx, &b.raw, b.args...)
		_ = pipe.Process(ctx, mget)
		_, _ = pipe.Exec(ctx)
		var ver string
		ver, err = verCmd.Result()
		if err == redis.Nil {
			err = nil
		}
		if err == nil {
			err = mget.Err()
		}
		if err == nil {
			if b.vals, err = b.raw.bulkArray(b.vals, len(b.bkeys)); err != nil {
				return err
			}
			return x.ensureEpochs(ctx, ver)
		}
		// The raw command is never retried by go-redis (it streams into
		// a writer); retry a network error once, as go-redis would.
		var rerr redis.Error
		if errors.As(err, &rerr) || ctx.Err() != nil {
			break
		}
	}
	clear(b.args)
	return err
}

// readValuesCluster: MGET may not span slots, and a prompt's keys are
// spread over all of them: one GET per key, which go-redis groups per node.
func (x *Index) readValuesCluster(ctx context.Context, b *lookupBuf) error {
	pipe := x.c.Pipeline()
	verCmd := pipe.HGet(ctx, x.podsKey, "_v")
	b.gets = b.gets[:0]
	for _, k := range b.bkeys {
		b.gets = append(b.gets, pipe.Get(ctx, k))
	}
	_, _ = pipe.Exec(ctx)
	defer clear(b.gets)
	ver, err := verCmd.Result()
	if err != nil && err != redis.Nil {
		return err
	}
	for _, c := range b.gets {
		s, err := c.Result()
		if err != nil && err != redis.Nil && !redis.HasErrorPrefix(err, "WRONGTYPE") {
			// WRONGTYPE: a key of the previous layout (a HASH), read
			// as absent like MGET does; the next add replaces it.
			return err
		}
		var v []byte
		if s != "" {
			// read-only view of the reply string
			v = unsafe.Slice(unsafe.StringData(s), len(s))
		}
		b.vals = append(b.vals, v)
	}
	return x.ensureEpochs(ctx, ver)
}

// sortHolders orders holders by (pod, tier): deterministic output
// whatever order Redis returned the hash fields in. Insertion sort: a block
// has a handful of holders.
func sortHolders(h []kvindex.Holder) {
	for i := 1; i < len(h); i++ {
		for j := i; j > 0 && holderLess(h[j], h[j-1]); j-- {
			h[j], h[j-1] = h[j-1], h[j]
		}
	}
}

func holderLess(a, b kvindex.Holder) bool {
	if a.Pod != b.Pod {
		return a.Pod < b.Pod
	}
	return a.Tier < b.Tier
}

// lookupScripted is Lookup on a single node: one EVALSHA that walks the keys
// server-side and stops at the first miss (see lookupScript).
func (x *Index) lookupScripted(ctx context.Context, b *lookupBuf, model kvindex.ModelID, keys []blockkeys.Key, v kvindex.Visitor) error {
	b.skeys = append(b.skeys[:0], x.podsKey)
	b.skeys = blockKeys(b.skeys, x.modelPrefix(model), keys)
	r, err := lookupScript.EvalSha(ctx, x.c, b.skeys).Slice()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		r, err = lookupScript.Eval(ctx, x.c, b.skeys).Slice()
		_ = x.loadScripts(ctx)
	}
	if err != nil {
		return unavailable("lookup", err)
	}
	if len(r) < 2 {
		return fmt.Errorf("redisindex: lookup: short reply (%d elements)", len(r))
	}
	deleted, _ := r[0].(int64)
	emptied, _ := r[1].(int64)
	x.expired.Add(deleted)
	if emptied > 0 {
		_ = countScript.Run(ctx, x.c, []string{x.podsKey}, "", "0", 0, 0, -emptied).Err()
	}
	pos := 2
	for i := 0; i < len(keys) && pos < len(r); i++ {
		n, ok := r[pos].(int64)
		if !ok || n < 0 || pos+1+int(n) > len(r) {
			return fmt.Errorf("redisindex: lookup: malformed reply at key %d", i)
		}
		b.holders = b.holders[:0]
		for _, f := range r[pos+1 : pos+1+int(n)] {
			fs, _ := f.(string)
			h, ok := x.parseField(fs)
			if !ok {
				x.malformed.Add(1)
				continue
			}
			b.holders = append(b.holders, h)
		}
		pos += 1 + int(n)
		if len(b.holders) == 0 {
			return nil
		}
		if !v.Visit(i, keys[i], b.holders) {
			return nil
		}
	}
	return nil
}
