// Package cache holds the block-cache eviction policies the simulator replays:
// LRU, LFU and S3FIFO, with the exact semantics of the prefix-cache replay
// definition (shared/seeds/001). Each policy is a small type with the same
// three operations so that `kvsim replay` (one cache) and every simulated
// pod of `kvsim simulate` run the very same code.
//
// Keys are block hashes (Mooncake hash_ids). A policy is not safe for
// concurrent use: the simulator is single-threaded by design (determinism).
package cache

import (
	"fmt"
	"math"
	"strings"
)

// Policy is a bounded set of resident blocks with an eviction rule.
type Policy interface {
	// Access applies one access of block h: a resident block updates its
	// recency/frequency, a non-resident one is admitted. Every block that
	// stops being resident because of this access (evictions) is appended to
	// evicted, which is returned; the caller may pass a reused slice.
	Access(h uint64, evicted []uint64) []uint64
	// Contains reports whether h is resident (S3FIFO: in S or M, never G).
	Contains(h uint64) bool
	// Len is the number of resident blocks.
	Len() int
	// Capacity is the configured maximum of resident blocks.
	Capacity() int
	// Name is the policy's flag name ("lru", "lfu", "s3fifo").
	Name() string
}

// Config selects and sizes a policy.
type Config struct {
	Policy     string  // lru | lfu | s3fifo
	Capacity   int     // blocks; must be >= 1
	SmallRatio float64 // s3fifo only; default 0.1
	MaxFreq    int     // s3fifo only; default 3
}

// New builds the policy named by cfg.Policy.
func New(cfg Config) (Policy, error) {
	if cfg.Capacity < 1 {
		return nil, fmt.Errorf("cache: capacity must be >= 1 block, got %d", cfg.Capacity)
	}
	switch strings.ToLower(cfg.Policy) {
	case "lru":
		return NewLRU(cfg.Capacity), nil
	case "lfu":
		return NewLFU(cfg.Capacity), nil
	case "s3fifo":
		r := cfg.SmallRatio
		if r == 0 {
			r = 0.1
		}
		mf := cfg.MaxFreq
		if mf == 0 {
			mf = 3
		}
		return NewS3FIFO(cfg.Capacity, r, mf)
	}
	return nil, fmt.Errorf("cache: unknown policy %q (want lru, lfu or s3fifo)", cfg.Policy)
}

// ---- shared intrusive doubly linked lists over a slab ----------------------

// node is one slab slot. Lists link slots by index so that moving a block
// between queues (S3FIFO) or to the tail (LRU) never allocates.
type node struct {
	key        uint64
	prev, next int32
	freq       int32  // S3FIFO freq / LFU count
	tick       uint64 // LFU: time of last access
	q          uint8  // S3FIFO: which queue holds the node
	heapIdx    int32  // LFU: position in the heap
}

const nilIdx = -1

type slab struct {
	nodes []node
	free  []int32
}

func (s *slab) alloc(key uint64) int32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		s.nodes[i] = node{key: key, prev: nilIdx, next: nilIdx}
		return i
	}
	s.nodes = append(s.nodes, node{key: key, prev: nilIdx, next: nilIdx})
	return int32(len(s.nodes) - 1)
}

func (s *slab) release(i int32) { s.free = append(s.free, i) }

// list is a FIFO (head = oldest, tail = newest) of slab indices.
type list struct {
	head, tail int32
	n          int
}

func newList() list { return list{head: nilIdx, tail: nilIdx} }

func (l *list) pushTail(s *slab, i int32) {
	nd := &s.nodes[i]
	nd.prev, nd.next = l.tail, nilIdx
	if l.tail != nilIdx {
		s.nodes[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
	l.n++
}

func (l *list) unlink(s *slab, i int32) {
	nd := &s.nodes[i]
	if nd.prev != nilIdx {
		s.nodes[nd.prev].next = nd.next
	} else {
		l.head = nd.next
	}
	if nd.next != nilIdx {
		s.nodes[nd.next].prev = nd.prev
	} else {
		l.tail = nd.prev
	}
	nd.prev, nd.next = nilIdx, nilIdx
	l.n--
}

func (l *list) popHead(s *slab) int32 {
	i := l.head
	l.unlink(s, i)
	return i
}

// ---- LRU --------------------------------------------------------------------

// LRU: an access moves the block to most-recent; admitting into a full cache
// evicts the least recent. O(1) per access.
type LRU struct {
	cap     int
	slab    slab
	recency list
	byID    map[uint64]int32
}

// NewLRU returns an empty LRU of capacity blocks (capacity >= 1).
func NewLRU(capacity int) *LRU {
	return &LRU{cap: capacity, recency: newList(), byID: make(map[uint64]int32)}
}

func (c *LRU) Name() string           { return "lru" }
func (c *LRU) Len() int               { return c.recency.n }
func (c *LRU) Capacity() int          { return c.cap }
func (c *LRU) Contains(h uint64) bool { _, ok := c.byID[h]; return ok }

func (c *LRU) Access(h uint64, evicted []uint64) []uint64 {
	if i, ok := c.byID[h]; ok {
		c.recency.unlink(&c.slab, i)
		c.recency.pushTail(&c.slab, i)
		return evicted
	}
	if c.recency.n >= c.cap {
		v := c.recency.popHead(&c.slab)
		k := c.slab.nodes[v].key
		delete(c.byID, k)
		c.slab.release(v)
		evicted = append(evicted, k)
	}
	i := c.slab.alloc(h)
	c.recency.pushTail(&c.slab, i)
	c.byID[h] = i
	return evicted
}

// ---- LFU --------------------------------------------------------------------

// LFU: a block's count starts at 1 when admitted and grows by 1 per access
// while resident; a full cache evicts the lowest count, ties broken by least
// recent access. A binary min-heap on (count, last access) gives O(log n).
type LFU struct {
	cap  int
	slab slab
	heap []int32
	byID map[uint64]int32
	now  uint64
}

// NewLFU returns an empty LFU of capacity blocks (capacity >= 1).
func NewLFU(capacity int) *LFU {
	return &LFU{cap: capacity, byID: make(map[uint64]int32)}
}

func (c *LFU) Name() string           { return "lfu" }
func (c *LFU) Len() int               { return len(c.heap) }
func (c *LFU) Capacity() int          { return c.cap }
func (c *LFU) Contains(h uint64) bool { _, ok := c.byID[h]; return ok }

func (c *LFU) less(a, b int32) bool {
	na, nb := &c.slab.nodes[a], &c.slab.nodes[b]
	if na.freq != nb.freq {
		return na.freq < nb.freq
	}
	return na.tick < nb.tick
}

func (c *LFU) swap(i, j int) {
	c.heap[i], c.heap[j] = c.heap[j], c.heap[i]
	c.slab.nodes[c.heap[i]].heapIdx = int32(i)
	c.slab.nodes[c.heap[j]].heapIdx = int32(j)
}

func (c *LFU) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !c.less(c.heap[i], c.heap[p]) {
			return
		}
		c.swap(i, p)
		i = p
	}
}

func (c *LFU) down(i int) {
	n := len(c.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && c.less(c.heap[r], c.heap[l]) {
			m = r
		}
		if !c.less(c.heap[m], c.heap[i]) {
			return
		}
		c.swap(i, m)
		i = m
	}
}

func (c *LFU) Access(h uint64, evicted []uint64) []uint64 {
	c.now++
	if i, ok := c.byID[h]; ok {
		nd := &c.slab.nodes[i]
		nd.freq++
		nd.tick = c.now
		c.down(int(nd.heapIdx)) // count and tick only grow: the node sinks
		return evicted
	}
	if len(c.heap) >= c.cap {
		v := c.heap[0]
		last := len(c.heap) - 1
		c.swap(0, last)
		c.heap = c.heap[:last]
		if last > 0 {
			c.down(0)
		}
		k := c.slab.nodes[v].key
		delete(c.byID, k)
		c.slab.release(v)
		evicted = append(evicted, k)
	}
	i := c.slab.alloc(h)
	nd := &c.slab.nodes[i]
	nd.freq, nd.tick = 1, c.now
	nd.heapIdx = int32(len(c.heap))
	c.heap = append(c.heap, i)
	c.up(len(c.heap) - 1)
	c.byID[h] = i
	return evicted
}

// ---- S3FIFO -----------------------------------------------------------------

const (
	qSmall uint8 = iota
	qMain
	qGhost
)

// S3FIFO (Yang et al., SOSP'23) exactly as the replay semantics in docs/simulator.md state it: three FIFO
// queues S (small, round-half-even(capacity*smallRatio)), M (main, the rest)
// and G (ghost, metadata only, capacity = main), a per-block frequency
// saturating at maxFreq, S->M promotion keeping freq, second-chance eviction
// from M with re-queue at the tail, ghost hit -> tail of M with freq 0.
// Resident = S ∪ M. Amortised O(1) per access: every second-chance requeue
// consumes one unit of a bounded freq.
type S3FIFO struct {
	cap, smallCap, mainCap, ghostCap int
	maxFreq                          int32
	slab                             slab
	small, main, ghost               list
	byID                             map[uint64]int32
	evicted                          []uint64 // scratch of the access in progress
}

// SmallCap is round-half-even(capacity * ratio), the Python round() of the
// reference: round(4096*0.1) = 410, round(25*0.1) = round(2.5) = 2,
// round(35*0.1) = round(3.5) = 4.
func SmallCap(capacity int, ratio float64) int {
	return int(math.RoundToEven(float64(capacity) * ratio))
}

// NewS3FIFO validates the sizes: both S and M must hold at least one block,
// otherwise the reference algorithm's drain loops have nothing to drain.
func NewS3FIFO(capacity int, smallRatio float64, maxFreq int) (*S3FIFO, error) {
	if smallRatio <= 0 || smallRatio >= 1 || math.IsNaN(smallRatio) {
		return nil, fmt.Errorf("cache: s3fifo small ratio must be in (0,1), got %v", smallRatio)
	}
	if maxFreq < 1 {
		return nil, fmt.Errorf("cache: s3fifo max freq must be >= 1, got %d", maxFreq)
	}
	small := SmallCap(capacity, smallRatio)
	main := capacity - small
	if small < 1 || main < 1 {
		return nil, fmt.Errorf("cache: s3fifo capacity %d with small ratio %v gives small=%d main=%d; both must be >= 1",
			capacity, smallRatio, small, main)
	}
	return &S3FIFO{
		cap: capacity, smallCap: small, mainCap: main, ghostCap: main, maxFreq: int32(maxFreq),
		small: newList(), main: newList(), ghost: newList(), byID: make(map[uint64]int32),
	}, nil
}

func (c *S3FIFO) Name() string  { return "s3fifo" }
func (c *S3FIFO) Len() int      { return c.small.n + c.main.n } // never the ghost
func (c *S3FIFO) Capacity() int { return c.cap }

// Sizes returns the queue capacities (small, main, ghost).
func (c *S3FIFO) Sizes() (small, main, ghost int) { return c.smallCap, c.mainCap, c.ghostCap }

// QueueLens returns the current |S|, |M|, |G|.
func (c *S3FIFO) QueueLens() (s, m, g int) { return c.small.n, c.main.n, c.ghost.n }

// Freq returns h's frequency and queue ("S", "M", "G") for tests; "" if unknown.
func (c *S3FIFO) Freq(h uint64) (int, string) {
	i, ok := c.byID[h]
	if !ok {
		return 0, ""
	}
	return int(c.slab.nodes[i].freq), [...]string{"S", "M", "G"}[c.slab.nodes[i].q]
}

func (c *S3FIFO) Contains(h uint64) bool {
	i, ok := c.byID[h]
	return ok && c.slab.nodes[i].q != qGhost
}

func (c *S3FIFO) Access(h uint64, evicted []uint64) []uint64 {
	c.evicted = evicted
	if i, ok := c.byID[h]; ok {
		nd := &c.slab.nodes[i]
		switch nd.q {
		case qSmall, qMain:
			if nd.freq < c.maxFreq {
				nd.freq++
			}
		case qGhost:
			// Ghost hit: leave G, enter the tail of M with freq 0.
			c.ghost.unlink(&c.slab, i)
			c.admitMain(i, 0)
		}
		return c.evicted
	}
	c.admitSmall(h)
	return c.evicted
}

func (c *S3FIFO) admitSmall(h uint64) {
	for c.small.n >= c.smallCap {
		v := c.small.popHead(&c.slab)
		if vf := c.slab.nodes[v].freq; vf >= 1 {
			c.admitMain(v, vf) // freq preserved, not reset
		} else {
			c.toGhost(v)
		}
	}
	i := c.slab.alloc(h)
	c.byID[h] = i
	c.slab.nodes[i].q, c.slab.nodes[i].freq = qSmall, 0
	c.small.pushTail(&c.slab, i)
}

// admitMain appends node i (already unlinked from its queue) at the tail of M
// with freq, first draining M until exactly one entry went to the ghost.
func (c *S3FIFO) admitMain(i int32, freq int32) {
	for c.main.n >= c.mainCap {
		v := c.main.popHead(&c.slab)
		if c.slab.nodes[v].freq >= 1 {
			c.slab.nodes[v].freq--
			c.main.pushTail(&c.slab, v) // second chance: back at the TAIL
			continue
		}
		c.toGhost(v)
		break
	}
	c.slab.nodes[i].q, c.slab.nodes[i].freq = qMain, freq
	c.main.pushTail(&c.slab, i)
}

// toGhost moves a node that just left S or M (so it stops being resident) to
// the tail of G, dropping G's oldest hash when G is full.
func (c *S3FIFO) toGhost(i int32) {
	c.evicted = append(c.evicted, c.slab.nodes[i].key)
	// A key lives in exactly one queue, so i cannot already be in G; the
	// reference's "remove then re-append" case cannot arise here.
	if c.ghost.n >= c.ghostCap {
		g := c.ghost.popHead(&c.slab)
		delete(c.byID, c.slab.nodes[g].key)
		c.slab.release(g)
	}
	c.slab.nodes[i].q, c.slab.nodes[i].freq = qGhost, 0
	c.ghost.pushTail(&c.slab, i)
}
