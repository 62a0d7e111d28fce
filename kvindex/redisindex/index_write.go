package redisindex

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// Add records that pod holds keys on tier: one pipelined round trip
// for the entries (one script run in single-node mode, one per key and node
// in Cluster mode) plus one for the pod's counter, shared with every write
// coalesced into the same flush (writer.go); that for every maxWriteKeys
// keys.
func (x *Index) Add(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	return x.writeChunks(ctx, opAdd, model, pod, tier, keys)
}

// Remove forgets that pod holds keys on tier.
func (x *Index) Remove(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	return x.writeChunks(ctx, opRemove, model, pod, tier, keys)
}

// maxWriteKeys bounds the keys of one write request. A larger Add or
// Remove (a publisher may send millions of hashes in one event) goes as
// consecutive requests of at most this many keys, so other pods' writes
// are flushed between them instead of waiting behind one long script that
// blocks Redis and the flush every pod's writes share (writer.go). The
// call deadline still covers the whole Add or Remove: a huge event fails
// at it, as before, and never holds its apply worker for longer.
const maxWriteKeys = 4096

func (x *Index) writeChunks(ctx context.Context, op writeOp, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	for first := true; first || len(keys) > 0; first = false {
		n := min(len(keys), maxWriteKeys)
		if err := x.write(ctx, op, model, pod, tier, keys[:n]); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// writeOp is one of the two block writes; it names the script and the
// arguments it takes.
type writeOp struct {
	name   string // for errors
	script *redis.Script
	remove bool
}

var (
	opAdd    = writeOp{name: "add", script: addScript}
	opRemove = writeOp{name: "remove", script: removeScript, remove: true}
)

// args builds the script arguments: an add takes the encoded record and
// the TTL, a removal neither.
func (op writeOp) args(field string, epoch uint64, es string, ttlMS int64, podF string) []any {
	if op.remove {
		return []any{field, es, podF}
	}
	return []any{encodeRecord(field, epoch), field, es, ttlMS, podF}
}

// maxFieldLen is the longest holder field a record can carry (2-byte
// length); a pod name is at most 253 bytes in Kubernetes, so only a
// misconfigured name reaches it.
const maxFieldLen = 0xffff

func errInvalidTier(op writeOp, tier event.Tier) error {
	return fmt.Errorf("redisindex: %s: invalid tier %d", op.name, tier)
}

func errFieldTooLong(op writeOp, field string) error {
	return fmt.Errorf("redisindex: %s: holder name of %d bytes is too long (max %d)", op.name, len(field), maxFieldLen)
}

// encodeRecord is one holder's record in a block value (see scripts.go):
// 2-byte length, field, 8-byte epoch, big endian.
func encodeRecord(field string, epoch uint64) string {
	b := make([]byte, 0, 2+len(field)+8)
	b = append(b, byte(len(field)>>8), byte(len(field)))
	b = append(b, field...)
	for s := 56; s >= 0; s -= 8 {
		b = append(b, byte(epoch>>uint(s)))
	}
	return string(b)
}

// nextRecord decodes the record of v starting at pos: its field, epoch and
// the position after it; ok=false when v is malformed from pos on.
func nextRecord[T string | []byte](v T, pos int) (field T, epoch uint64, next int, ok bool) {
	if pos+10 > len(v) {
		return field, 0, 0, false
	}
	n := int(v[pos])<<8 | int(v[pos+1])
	next = pos + 10 + n
	if next > len(v) {
		return field, 0, 0, false
	}
	for i := pos + 2 + n; i < next; i++ {
		epoch = epoch<<8 | uint64(v[i])
	}
	return v[pos+2 : pos+2+n], epoch, next, true
}

// tally sums the per-key codes of one write into the counter deltas of the
// pod (entries, blocks) and of the namespace (keys), negated for a removal,
// and reports whether any entry carried a newer epoch than the writer's.
func (op writeOp) tally(codes []int64) (entries, blocks, keys int64, behind bool) {
	for _, raw := range codes {
		c := blockCode(raw)
		behind = behind || c.has(codeBehind)
		if c.has(codeEntry) {
			entries++
		}
		if c.has(codeKey) {
			keys++
		}
		if c.has(codeBlock) {
			blocks++
		}
	}
	if op.remove {
		return -entries, -blocks, -keys, behind
	}
	return entries, blocks, keys, behind
}

// ClearPod forgets everything pod holds in O(1): it moves the pod to a new
// epoch; entries of older epochs are invisible from then on and deleted
// lazily by readers (or by the TTL).
func (x *Index) ClearPod(ctx context.Context, pod kvindex.PodID) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	podF := x.podFieldOf(pod)
	known := x.epochOf(pod)
	r, err := clearScript.Run(ctx, x.c, []string{x.podsKey}, podF, strconv.FormatUint(known, 10)).StringSlice()
	if err != nil {
		return unavailable("clear", err)
	}
	if len(r) != 3 {
		return fmt.Errorf("redisindex: clear: unexpected reply %q", r)
	}
	e, err := strconv.ParseUint(r[0], 10, 64)
	if err != nil {
		return fmt.Errorf("redisindex: clear: bad epoch %q", r[0])
	}
	x.emu.Lock()
	// Copy on write: readers use the map after releasing the lock.
	epochs := make(map[kvindex.PodID]uint64, len(x.epochs)+1)
	for p, v := range x.epochs {
		epochs[p] = v
	}
	epochs[pod] = max(e, epochs[pod])
	x.epochs = epochs
	if x.eLoaded && x.eVer == r[1] {
		x.eVer = r[2] // nobody else cleared anything since our copy
	} else {
		x.eLoaded = false // reload at next use
	}
	x.emu.Unlock()
	return nil
}

// ClearPodsNamed clears every DP rank of the pod called name that the
// shared index knows of (its epochs in the pods hash), not only the ranks
// this process has seen. A daemon taking over an endpoint from a daemon that
// died calls it (leases.Takeover.Prepare) for every pod name recorded for
// that endpoint before subscribing: what the index holds for those pods may
// have missed events during the takeover gap.
func (x *Index) ClearPodsNamed(ctx context.Context, name string) error {
	ctx, cancel := x.callCtx(ctx)
	defer cancel()
	fields, err := x.c.HKeys(ctx, x.podsKey).Result()
	if err != nil {
		return unavailable("clear", err)
	}
	// A pod appears as e: (cleared before) and/or n:, m: (ever added).
	ranks := map[int]bool{}
	for _, f := range fields {
		if len(f) < 2 || f[1] != ':' || (f[0] != 'e' && f[0] != 'n' && f[0] != 'm') {
			continue
		}
		r, n, ok := strings.Cut(f[2:], ".")
		if !ok || n != name {
			continue
		}
		if rank, err := strconv.Atoi(r); err == nil && rank >= 0 {
			ranks[rank] = true
		}
	}
	for rank := range ranks {
		if err := x.ClearPod(ctx, x.in.Pod(name, rank)); err != nil {
			return err
		}
	}
	return nil
}
