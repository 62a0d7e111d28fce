package mooncake

// Engine is a mock inference engine's GPU block pool with prefix caching: a
// fixed number of blocks, every block of a request resident once it ran,
// the least recently used evicted when a new block needs room. Prefill is
// instantaneous and blocks are released as soon as the request ran, so every
// resident block is evictable (no running request pins any).
//
// A request's blocks are touched from its last block to its first, as vLLM
// frees a finished request's blocks tail first: a block is then always more
// recent than its descendants, so eviction takes leaves before their
// parents and what stays resident is closed under prefixes.
type Engine struct {
	capacity int
	slot     map[uint64]int32 // block id -> node
	id       []uint64         // node -> block id
	prev     []int32          // toward the most recent; -1 at the head
	next     []int32          // toward the least recent; -1 at the tail
	head     int32            // most recently used, -1 when empty
	tail     int32
	free     []int32
	// scratch, reused across Run calls
	hit []bool
}

// NewEngine returns an empty pool of capacity blocks.
func NewEngine(capacity int) *Engine {
	e := &Engine{capacity: capacity, slot: make(map[uint64]int32, capacity),
		id: make([]uint64, capacity), prev: make([]int32, capacity), next: make([]int32, capacity),
		head: -1, tail: -1, free: make([]int32, capacity)}
	for i := range e.free {
		e.free[i] = int32(capacity - 1 - i)
	}
	return e
}

// Resident is the number of blocks in the pool.
func (e *Engine) Resident() int { return len(e.slot) }

// Holds reports whether block id is resident.
func (e *Engine) Holds(id uint64) bool { _, ok := e.slot[id]; return ok }

// Step is what running one request did to the pool.
type Step struct {
	Evicted []uint64 // in eviction order, least recent first
	// Stored are the runs of consecutive blocks of the request that were
	// not resident: ids[Runs[i].From:Runs[i].To]. With a prefix-closed pool
	// there is at most one, the request's uncached tail.
	Runs []Run
}

// Run is a half-open range of a request's blocks.
type Run struct{ From, To int }

// Run runs a request with blocks ids (at most the pool's capacity; the
// caller truncates longer ones, which an engine could not schedule) and
// returns, in st (reused), the blocks it evicted and stored.
func (e *Engine) Run(ids []uint64, st *Step) {
	st.Evicted, st.Runs = st.Evicted[:0], st.Runs[:0]
	if len(ids) > e.capacity {
		ids = ids[:e.capacity]
	}
	e.hit = e.hit[:0]
	missing := 0
	for i, id := range ids {
		n, ok := e.slot[id]
		if ok {
			e.moveFront(n) // out of eviction's way while the misses get room
		} else {
			missing++
			if i == 0 || e.hit[i-1] {
				st.Runs = append(st.Runs, Run{From: i, To: i + 1})
			} else {
				st.Runs[len(st.Runs)-1].To = i + 1
			}
		}
		e.hit = append(e.hit, ok)
	}
	for len(e.free) < missing {
		n := e.tail
		st.Evicted = append(st.Evicted, e.id[n])
		delete(e.slot, e.id[n])
		e.unlink(n)
		e.free = append(e.free, n)
	}
	for i := len(ids) - 1; i >= 0; i-- {
		if n, ok := e.slot[ids[i]]; ok { // a hit, or a block repeated within the request
			e.moveFront(n)
			continue
		}
		n := e.free[len(e.free)-1]
		e.free = e.free[:len(e.free)-1]
		e.id[n] = ids[i]
		e.slot[ids[i]] = n
		e.pushFront(n)
	}
}

func (e *Engine) unlink(n int32) {
	p, x := e.prev[n], e.next[n]
	if p >= 0 {
		e.next[p] = x
	} else {
		e.head = x
	}
	if x >= 0 {
		e.prev[x] = p
	} else {
		e.tail = p
	}
}

func (e *Engine) pushFront(n int32) {
	e.prev[n], e.next[n] = -1, e.head
	if e.head >= 0 {
		e.prev[e.head] = n
	} else {
		e.tail = n
	}
	e.head = n
}

func (e *Engine) moveFront(n int32) {
	if e.head == n {
		return
	}
	e.unlink(n)
	e.pushFront(n)
}
