package redisindex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvindex/kvindex/kvindex"
	"github.com/redis/go-redis/v9"
)

// Index is the Redis-backed kvindex.Index (see doc.go for the schema). It is
// safe for concurrent use by any number of goroutines and daemons.
type Index struct {
	c          redis.UniversalClient
	cluster    bool
	serverWalk bool // single node + Config.ServerWalk: lookups use lookupScript
	ns         string
	ttlMS      int64
	in         *kvindex.Interner
	podsKey    string

	// epochs is this process' copy of the pods hash: every pod's current
	// epoch and the version (_v) it was read at. The map is never mutated
	// once published (copy on write), so readers may use it unlocked.
	emu     sync.RWMutex
	eLoaded bool
	eVer    string
	epochs  map[kvindex.PodID]uint64

	// name caches: PodID -> "<rank>.<name>", holder -> field, model -> key
	// prefix, field -> holder. All grow with the fleet only (pods x tiers x
	// groups, models), never with blocks; fields is bounded anyway because
	// it is filled from data read out of Redis.
	nmu      sync.RWMutex
	podField map[kvindex.PodID]string
	holderF  map[kvindex.Holder]string
	modelPfx map[kvindex.ModelID]string
	fields   map[string]kvindex.Holder

	cleanup chan cleanupItem

	// write coalescing (writer.go)
	wc              committer
	wReqs, wFlushes atomic.Int64

	entries, keys, expired atomic.Int64
	malformed              atomic.Int64
	// ttlExpired counts block keys Redis expired (keyspace notifications,
	// see expiry.go); warned* make each expiry-watcher warning log once.
	ttlExpired                                  atomic.Int64
	warnedOff, warnedUnreadable, warnedNoSubscr atomic.Bool

	log        *slog.Logger
	stop       context.CancelFunc
	done       chan struct{}
	watchers   sync.WaitGroup // expiry watchers (expiry.go)
	closed     atomic.Bool
	ownsClient bool
}

type cleanupItem struct {
	key, field, value string
}

const maxFieldCache = 1 << 16

var _ kvindex.Index = (*Index)(nil)
var _ kvindex.HealthChecker = (*Index)(nil)
var _ kvindex.PodBlocksBatcher = (*Index)(nil)

// New connects to Redis as configured. It does not fail when Redis is down:
// Healthy reports the problem, operations return errors wrapping
// ErrUnavailable, and go-redis reconnects by itself when Redis is back. It
// fails only on a configuration error.
func New(ctx context.Context, cfg Config) (*Index, error) {
	if cfg.Interner == nil {
		return nil, errors.New("redisindex: Config.Interner is required")
	}
	o, err := cfg.universalOptions()
	if err != nil {
		return nil, fmt.Errorf("redisindex: %s: %w", redactURL(cfg.URL), err)
	}
	cfg.ServerWalk = o.serverWalk
	x := newIndex(o.client(), o.cluster, o.namespace, o.ttl, cfg)
	// Best effort: warm the epoch cache and script cache now so the first
	// request does not pay for it. Failure is not an error (Redis may come
	// up later).
	wctx, cancel := context.WithTimeout(ctx, orDur(cfg.DialTimeout, DefaultDialTimeout)+orDur(cfg.ReadTimeout, DefaultIOTimeout))
	_ = x.refresh(wctx)
	cancel()
	return x, nil
}

// NewWithClient wraps an existing client (tests, or a daemon sharing one
// client between the index and the lease manager). Close does not close it.
func NewWithClient(c redis.UniversalClient, cfg Config) (*Index, error) {
	if cfg.Interner == nil {
		return nil, errors.New("redisindex: Config.Interner is required")
	}
	ns, ttl, err := cfg.namespaceAndTTL(DefaultNamespace, DefaultTTL)
	if err != nil {
		return nil, fmt.Errorf("redisindex: %w", err)
	}
	_, isCluster := c.(*redis.ClusterClient)
	x := newIndex(c, isCluster, ns, ttl, cfg)
	x.ownsClient = false
	return x, nil
}

func newIndex(c redis.UniversalClient, cluster bool, ns string, ttl time.Duration, cfg Config) *Index {
	q := cfg.CleanupQueue
	if q <= 0 {
		q = 1 << 16
	}
	x := &Index{
		c: c, cluster: cluster, ns: ns, in: cfg.Interner,
		podsKey:  ns + ":pods",
		epochs:   map[kvindex.PodID]uint64{},
		podField: map[kvindex.PodID]string{},
		holderF:  map[kvindex.Holder]string{},
		modelPfx: map[kvindex.ModelID]string{},
		fields:   map[string]kvindex.Holder{},
		cleanup:  make(chan cleanupItem, q),
		done:     make(chan struct{}),
		log:      cfg.Logger,
	}
	if x.log == nil {
		x.log = slog.Default()
	}
	x.ownsClient = true
	x.serverWalk = cfg.ServerWalk && !cluster
	if ttl > 0 {
		x.ttlMS = max(ttl.Milliseconds(), 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.stop = cancel
	go x.background(ctx, orDur(cfg.StatsRefresh, DefaultStatsRefresh))
	x.startExpiryWatch(ctx)
	return x
}

// Close stops the background work and closes the client (if New made it).
func (x *Index) Close() error {
	if x.closed.Swap(true) {
		return nil
	}
	x.stop()
	<-x.done
	x.watchers.Wait()
	if x.ownsClient {
		return x.c.Close()
	}
	return nil
}

// Client is the underlying go-redis client (shared with the lease manager).
func (x *Index) Client() redis.UniversalClient { return x.c }

// Namespace is the key prefix in use.
func (x *Index) Namespace() string { return x.ns }

// Healthy pings Redis (every master in Cluster mode).
func (x *Index) Healthy(ctx context.Context) error {
	var err error
	if cc, ok := x.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
		if err == nil {
			// ForEachMaster succeeds vacuously before the slots are known.
			err = cc.Ping(ctx).Err()
		}
	} else {
		err = x.c.Ping(ctx).Err()
	}
	if err != nil {
		return unavailable("health", err)
	}
	return nil
}

// ---- names -------------------------------------------------------------

func (x *Index) podFieldOf(p kvindex.PodID) string {
	x.nmu.RLock()
	s, ok := x.podField[p]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	name, rank := x.in.PodName(p)
	s = strconv.Itoa(rank) + "." + name
	x.nmu.Lock()
	x.podField[p] = s
	x.nmu.Unlock()
	return s
}

func (x *Index) holderField(h kvindex.Holder) string {
	x.nmu.RLock()
	s, ok := x.holderF[h]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	s = strconv.Itoa(int(h.Tier)) + "." + strconv.Itoa(int(h.Group)) + "." + x.podFieldOf(h.Pod)
	x.nmu.Lock()
	x.holderF[h] = s
	x.nmu.Unlock()
	return s
}

// parseField turns "<tier>.<group>.<rank>.<pod name>" into a Holder.
func (x *Index) parseField(f string) (kvindex.Holder, bool) {
	x.nmu.RLock()
	h, ok := x.fields[f]
	x.nmu.RUnlock()
	if ok {
		return h, true
	}
	parts := strings.SplitN(f, ".", 4)
	if len(parts) != 4 || parts[3] == "" {
		return h, false
	}
	tier, e1 := strconv.ParseUint(parts[0], 10, 8)
	group, e2 := strconv.ParseUint(parts[1], 10, 8)
	rank, e3 := strconv.ParseInt(parts[2], 10, 32)
	if e1 != nil || e2 != nil || e3 != nil || tier >= uint64(kvindex.NumTiers) || rank < 0 {
		return h, false
	}
	h = kvindex.Holder{Pod: x.in.Pod(parts[3], int(rank)), Tier: kvindex.Tier(tier), Group: uint8(group)}
	x.nmu.Lock()
	if len(x.fields) < maxFieldCache {
		x.fields[f] = h
	}
	x.nmu.Unlock()
	return h, true
}

// parsePodField turns "<rank>.<pod name>" into a PodID.
func (x *Index) parsePodField(f string) (kvindex.PodID, bool) {
	r, name, ok := strings.Cut(f, ".")
	if !ok || name == "" {
		return 0, false
	}
	rank, err := strconv.ParseInt(r, 10, 32)
	if err != nil || rank < 0 {
		return 0, false
	}
	return x.in.Pod(name, int(rank)), true
}

// modelPrefix is "<ns>:b:<model>:". '{', '}' and '%' in model names are
// %-escaped so a model name can never become a Cluster hash tag (which would
// put every block of that model in one slot).
func (x *Index) modelPrefix(m kvindex.ModelID) string {
	x.nmu.RLock()
	s, ok := x.modelPfx[m]
	x.nmu.RUnlock()
	if ok {
		return s
	}
	s = x.modelPrefixOf(x.in.ModelName(m))
	x.nmu.Lock()
	x.modelPfx[m] = s
	x.nmu.Unlock()
	return s
}

const hexDigits = "0123456789abcdef"

// blockKeysInto is blockKeys into a reused buffer: the strings it returns
// are views of buf and change when buf is reused, so they must not outlive
// the caller's use of buf (Lookup clones the few it keeps).
func blockKeysInto(dst []string, buf []byte, prefix string, keys []kvindex.Key) ([]string, []byte) {
	n := len(prefix) + 16
	buf = slices.Grow(buf[:0], n*len(keys))
	for _, k := range keys {
		buf = append(buf, prefix...)
		for s := 60; s >= 0; s -= 4 {
			buf = append(buf, hexDigits[(uint64(k)>>uint(s))&0xf])
		}
	}
	all := unsafe.String(unsafe.SliceData(buf), len(buf))
	for i := range keys {
		dst = append(dst, all[i*n:(i+1)*n])
	}
	return dst, buf
}

// blockKeys fills dst with prefix+16 hex digits per key, building all of them
// in one string allocation.
func blockKeys(dst []string, prefix string, keys []kvindex.Key) []string {
	n := len(prefix) + 16
	buf := make([]byte, 0, n*len(keys))
	for _, k := range keys {
		buf = append(buf, prefix...)
		for s := 60; s >= 0; s -= 4 {
			buf = append(buf, hexDigits[(uint64(k)>>uint(s))&0xf])
		}
	}
	all := string(buf)
	for i := range keys {
		dst = append(dst, all[i*n:(i+1)*n])
	}
	return dst
}

// ---- epochs ------------------------------------------------------------

func (x *Index) epochOf(p kvindex.PodID) uint64 {
	x.emu.RLock()
	e := x.epochs[p]
	x.emu.RUnlock()
	return e
}

// ensureEpochs reloads the pods hash when its _v differs from our copy.
func (x *Index) ensureEpochs(ctx context.Context, ver string) error {
	x.emu.RLock()
	fresh := x.eLoaded && x.eVer == ver
	x.emu.RUnlock()
	if fresh {
		return nil
	}
	return x.loadEpochs(ctx)
}

// loadEpochs reads the whole pods hash (one command, one node): epochs,
// version, and the counters behind Stats.
func (x *Index) loadEpochs(ctx context.Context) error {
	m, err := x.c.HGetAll(ctx, x.podsKey).Result()
	if err != nil {
		return err
	}
	epochs := make(map[kvindex.PodID]uint64, len(m)/2)
	var entries int64
	for f, v := range m {
		switch {
		case strings.HasPrefix(f, "e:"):
			if p, ok := x.parsePodField(f[2:]); ok {
				if e, err := strconv.ParseUint(v, 10, 64); err == nil {
					epochs[p] = e
				}
			}
		case strings.HasPrefix(f, "m:"):
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				entries += n
			}
		}
	}
	keys, _ := strconv.ParseInt(m["_k"], 10, 64)
	x.emu.Lock()
	x.epochs, x.eVer, x.eLoaded = epochs, m["_v"], true
	x.emu.Unlock()
	x.entries.Store(entries)
	x.keys.Store(max(keys, 0))
	return nil
}

// ---- background --------------------------------------------------------

func (x *Index) background(ctx context.Context, every time.Duration) {
	defer close(x.done)
	t := time.NewTicker(every)
	defer t.Stop()
	batch := make([]cleanupItem, 0, 256)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Epochs and the Stats counters only: scripts are reloaded
			// on demand (NOSCRIPT) after a Redis restart.
			rctx, cancel := context.WithTimeout(ctx, every)
			_ = x.loadEpochs(rctx)
			cancel()
		case it := <-x.cleanup:
			batch = append(batch[:0], it)
		drain:
			for len(batch) < cap(batch) {
				select {
				case it := <-x.cleanup:
					batch = append(batch, it)
				default:
					break drain
				}
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			x.runCleanup(rctx, batch)
			cancel()
		}
	}
}

func (x *Index) refresh(ctx context.Context) error {
	if err := x.loadScripts(ctx); err != nil {
		return err
	}
	return x.loadEpochs(ctx)
}

func (x *Index) loadScripts(ctx context.Context) error {
	for _, s := range allScripts {
		if err := s.Load(ctx, x.c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// runCleanup deletes stale entries found by readers (compare-and-delete),
// counting them as Expired. One pipelined round trip per node.
func (x *Index) runCleanup(ctx context.Context, items []cleanupItem) {
	pipe := x.c.Pipeline()
	cmds := make([]*redis.Cmd, len(items))
	for i, it := range items {
		cmds[i] = cleanupScript.EvalSha(ctx, pipe, []string{it.key}, it.field, it.value)
	}
	_, _ = pipe.Exec(ctx)
	if x.retryNoScript(ctx, cmds, func(i int) *redis.Cmd {
		return cleanupScript.Eval(ctx, x.c, []string{items[i].key}, items[i].field, items[i].value)
	}) != nil {
		return
	}
	var emptied int64
	for _, c := range cmds {
		r, err := c.Int64Slice()
		if err != nil || len(r) != 2 {
			continue
		}
		x.expired.Add(r[0])
		emptied += r[1]
	}
	if emptied > 0 {
		_ = countScript.Run(ctx, x.c, []string{x.podsKey}, "", "0", 0, 0, -emptied).Err()
	}
}

// retryNoScript re-runs, one by one with EVAL, the commands that failed with
// NOSCRIPT (Redis restarted or SCRIPT FLUSH); the script cache is reloaded
// for later pipelines. Any other error is returned.
func (x *Index) retryNoScript(ctx context.Context, cmds []*redis.Cmd, redo func(i int) *redis.Cmd) error {
	reloaded := false
	for i, c := range cmds {
		err := c.Err()
		if err == nil {
			continue
		}
		if !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return err
		}
		if !reloaded {
			_ = x.loadScripts(ctx)
			reloaded = true
		}
		cmds[i] = redo(i)
		if err := cmds[i].Err(); err != nil {
			return err
		}
	}
	return nil
}

// ---- write path ----------------------------------------------------------

// Add records that pod holds keys on tier/group: one pipelined round trip
// for the entries (one script run in single-node mode, one per key and node
// in Cluster mode) plus one for the pod's counter, shared with every write
// coalesced into the same flush (writer.go).
func (x *Index) Add(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier kvindex.Tier, group uint8, keys []kvindex.Key) error {
	return x.write(ctx, opAdd, model, pod, tier, group, keys)
}

// Remove forgets that pod holds keys on tier/group.
func (x *Index) Remove(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier kvindex.Tier, group uint8, keys []kvindex.Key) error {
	return x.write(ctx, opRemove, model, pod, tier, group, keys)
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

func errInvalidTier(op writeOp, tier kvindex.Tier) error {
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

// PodBlocks is the number of distinct blocks pod holds (a block on two tiers
// counts once), as counted by the writers. Blocks dropped by the TTL are not
// subtracted.
func (x *Index) PodBlocks(ctx context.Context, pod kvindex.PodID) (int64, error) {
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

// Stats returns counters refreshed in the background (Entries, Keys) and
// counted locally: Expired is the stale entries this process found and
// deleted plus the block keys Redis expired by their TTL
// (TTLExpirations).
func (x *Index) Stats() kvindex.IndexStats {
	return kvindex.IndexStats{
		Entries: x.entries.Load(),
		Keys:    x.keys.Load(),
		Expired: x.expired.Load() + x.ttlExpired.Load(),
	}
}

// TTLExpirations is the number of block keys of this namespace that Redis
// removed because their TTL fired, as seen by this process through keyspace
// notifications (every daemon sharing the namespace sees every expiration).
// It stays 0 when the server's notify-keyspace-events lacks E and x (a
// warning is logged at start). Included in Stats().Expired.
func (x *Index) TTLExpirations() int64 { return x.ttlExpired.Load() }

// Malformed counts entries read from Redis that this version cannot parse
// (written by a foreign or newer writer); they are ignored.
func (x *Index) Malformed() int64 { return x.malformed.Load() }

// ---- read path ---------------------------------------------------------

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
func (x *Index) Lookup(ctx context.Context, model kvindex.ModelID, keys []kvindex.Key, v kvindex.Visitor) error {
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

// rawReply collects one raw RESP reply (redis.RawWriteToCmd writes into it).
type rawReply struct{ b []byte }

func (r *rawReply) Write(p []byte) (int, error) {
	r.b = append(r.b, p...)
	return len(p), nil
}

// ReadFrom lets io.Copy (which go-redis uses for each bulk string) read
// straight into the buffer instead of allocating a copy buffer per value.
func (r *rawReply) ReadFrom(src io.Reader) (int64, error) {
	var total int64
	for {
		if len(r.b) == cap(r.b) {
			r.b = append(r.b, 0)[:len(r.b)]
		}
		n, err := src.Read(r.b[len(r.b):cap(r.b)])
		r.b = r.b[:len(r.b)+n]
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// bulkArray splits the reply, which must be an array of n bulk strings or
// nulls (MGET's shape, RESP2 or RESP3), into dst: one slice per element
// pointing into the reply, nil for a null.
func (r *rawReply) bulkArray(dst [][]byte, n int) ([][]byte, error) {
	b := r.b
	line, rest, ok := respLine(b)
	if !ok || len(line) == 0 {
		return dst, errors.New("redisindex: truncated MGET reply")
	}
	if line[0] == '-' {
		return dst, fmt.Errorf("redisindex: MGET: %s", line[1:])
	}
	if line[0] != '*' {
		return dst, fmt.Errorf("redisindex: MGET reply of type %q, want an array", line[0])
	}
	if cnt, err := strconv.Atoi(string(line[1:])); err != nil || cnt != n {
		return dst, fmt.Errorf("redisindex: MGET of %d keys answered %q values", n, line[1:])
	}
	for i := 0; i < n; i++ {
		line, rest, ok = respLine(rest)
		if !ok || len(line) == 0 {
			return dst, errors.New("redisindex: truncated MGET reply")
		}
		switch {
		case line[0] == '_' || string(line) == "$-1":
			dst = append(dst, nil)
		case line[0] == '$':
			l, err := strconv.Atoi(string(line[1:]))
			if err != nil || l < 0 || l+2 > len(rest) {
				return dst, errors.New("redisindex: malformed MGET reply")
			}
			dst = append(dst, rest[:l:l])
			rest = rest[l+2:]
		default:
			return dst, fmt.Errorf("redisindex: MGET element of type %q", line[0])
		}
	}
	return dst, nil
}

// respLine splits off one CRLF-terminated line.
func respLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.Index(b, crlf)
	if i < 0 {
		return nil, nil, false
	}
	return b[:i], b[i+2:], true
}

var crlf = []byte("\r\n")

// sortHolders orders holders by (pod, tier, group): deterministic output
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
	if a.Tier != b.Tier {
		return a.Tier < b.Tier
	}
	return a.Group < b.Group
}

// lookupScripted is Lookup on a single node: one EVALSHA that walks the keys
// server-side and stops at the first miss (see lookupScript).
func (x *Index) lookupScripted(ctx context.Context, b *lookupBuf, model kvindex.ModelID, keys []kvindex.Key, v kvindex.Visitor) error {
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
