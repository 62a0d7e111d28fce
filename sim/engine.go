package sim

import (
	"errors"
	"fmt"
	"math"
)

// engineConfig is one vLLM pod of the scenario simulator (docs/simulator.md,
// "Engine model"). Times are seconds.
type engineConfig struct {
	KVBlocks            int // KV cache capacity in blocks (kv_tokens_per_pod / block_size)
	BlockSize           int // tokens per block
	MaxNumSeqs          int // running sequences at most
	MaxNumBatchedTokens int // tokens scheduled per step at most (prefill chunks + decodes)
	// PrefillTokensPerS is the compute-bound rate at which a step processes
	// prompt tokens (prefill or recompute chunks).
	PrefillTokensPerS float64
	// DecodeITL is the time of a step that decodes one short sequence: one
	// pass over the weights plus launch overheads.
	DecodeITL float64
	// DecodePerSeq is the extra step time per decoding sequence.
	DecodePerSeq float64
	// DecodePerKVToken is the extra step time per context token the step's
	// decoding sequences attend over (reading their KV from HBM), which is
	// what makes the inter-token latency grow with the batch.
	DecodePerKVToken float64
	// SharedKVReadOnce charges a KV block that several decoding sequences
	// share (a prefix-cache hit) once per step instead of once per sequence:
	// the optimistic bound for shared-prefix reuse in the GPU's L2 (one
	// layer's 6,000-token system prompt is 12 MB per GPU for Qwen3-32B TP 2,
	// H100's L2 is 50 MB). Off: every sequence reads its whole context from
	// HBM, the pessimistic bound.
	SharedKVReadOnce bool
	// SharedKVReadShare, when SharedKVReadOnce is set, puts the charge
	// between the two bounds: every holder after the first pays this share
	// of a shared block's read (0: read once, the optimistic bound; 1: every
	// holder reads it, the pessimistic one).
	SharedKVReadShare float64
}

func (c engineConfig) validate() error {
	if c.KVBlocks < 1 || c.BlockSize < 1 || c.MaxNumSeqs < 1 || c.MaxNumBatchedTokens < 1 {
		return errors.New("engine: kv blocks, block size, max_num_seqs and max_num_batched_tokens must be >= 1")
	}
	if !(c.PrefillTokensPerS > 0) || math.IsInf(c.PrefillTokensPerS, 0) {
		return errors.New("engine: prefill_tokens_per_s must be positive and finite")
	}
	for _, x := range []float64{c.DecodeITL, c.DecodePerSeq, c.DecodePerKVToken} {
		if !(x >= 0) || math.IsInf(x, 0) {
			return errors.New("engine: decode times must be finite and >= 0")
		}
	}
	if !(c.SharedKVReadShare >= 0 && c.SharedKVReadShare <= 1) {
		return errors.New("engine: shared_kv_read_share must be in [0, 1]")
	}
	if c.SharedKVReadShare > 0 && !c.SharedKVReadOnce {
		return errors.New("engine: shared_kv_read_share needs shared_kv_read_once: true")
	}
	if c.DecodeITL+c.DecodePerSeq <= 0 {
		return errors.New("engine: decode_itl_s + decode_per_seq_s must be > 0 (a step must take time)")
	}
	return nil
}

// stepTime is the model of one engine step: a fixed part, the prefill chunk
// tokens at the prefill rate, and the decode part growing with the number
// of decoding sequences and the context they attend over.
func (c engineConfig) stepTime(prefillTokens, decodeSeqs, decodeContext int) float64 {
	return c.DecodeITL + float64(prefillTokens)/c.PrefillTokensPerS +
		float64(decodeSeqs)*c.DecodePerSeq + float64(decodeContext)*c.DecodePerKVToken
}

// engineSeq is one request inside an engine, following vLLM's unified view:
// the sequence has numTokens() = prompt + generated tokens; a step schedules
// up to numTokens()-computed of them (a prefill chunk, or one token when
// decoding); when computed catches up the step samples one more token.
type engineSeq struct {
	req        int // index into the cluster's request table
	promptLen  int
	outputLen  int
	hashes     []uint64 // full prompt blocks' hashes at the engine block size
	outSalt    uint64   // makes blocks that hold generated tokens unique to this request
	computed   int
	generated  int
	blocks     []int32 // allocated blocks, in token order
	registered int     // leading blocks already entered into the prefix cache
	scheduled  int     // tokens scheduled in the current step
	admitted   bool    // was admitted at least once (hit accounting is on first admission)
	hitTokens  int     // prefix-cache hit on first admission
	preempted  int
	aborted    bool // the client went away: leaves at the next chance, frees its blocks
}

func (s *engineSeq) numTokens() int { return s.promptLen + s.generated }

// blockHash is the prefix-cache key of block k: the prompt's own hash for a
// full prompt block, otherwise a hash unique to the request (blocks that hold
// generated tokens never match another request, but a preempted request
// finds its own again).
func (s *engineSeq) blockHash(k int) uint64 {
	if k < len(s.hashes) {
		return s.hashes[k]
	}
	return mix64(s.outSalt ^ mix64(uint64(k)+0x632be59bd9b4e019))
}

// mix64 is the splitmix64 finaliser: a cheap deterministic hash.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// blockPool is vLLM's KV block manager with automatic prefix caching: blocks
// are reference counted; a block whose count drops to zero joins the tail
// of the free queue but keeps its contents and stays findable by hash until
// an allocation takes it from the head of the queue (LRU over free blocks).
type blockPool struct {
	n          int
	ref        []int32
	hash       []uint64
	cached     []bool
	prev, next []int32 // free queue, doubly linked; sentinel index n
	nFree      int
	byHash     map[uint64]int32
	ops        []kvOp // KV events since the last drain, in the order the cache changed
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{n: n, ref: make([]int32, n), hash: make([]uint64, n), cached: make([]bool, n),
		prev: make([]int32, n+1), next: make([]int32, n+1), byHash: make(map[uint64]int32, n)}
	s := int32(n)
	p.prev[s], p.next[s] = s, s
	for b := int32(0); b < int32(n); b++ {
		p.pushTail(b)
	}
	return p
}

func (p *blockPool) pushTail(b int32) {
	s := int32(p.n)
	last := p.prev[s]
	p.next[last], p.prev[b] = b, last
	p.next[b], p.prev[s] = s, b
	p.nFree++
}

func (p *blockPool) unlink(b int32) {
	p.next[p.prev[b]], p.prev[p.next[b]] = p.next[b], p.prev[b]
	p.nFree--
}

// lookup returns the cached block holding h, or -1.
func (p *blockPool) lookup(h uint64) int32 {
	if b, ok := p.byHash[h]; ok {
		return b
	}
	return -1
}

// touch takes a reference on a cached block (leaving the free queue if it was there).
func (p *blockPool) touch(b int32) {
	if p.ref[b] == 0 {
		p.unlink(b)
	}
	p.ref[b]++
}

// allocate takes the least recently freed block; a cached one is evicted
// (BlockRemoved). The caller checks nFree first.
func (p *blockPool) allocate() int32 {
	b := p.next[p.n]
	p.unlink(b)
	if p.cached[b] {
		delete(p.byHash, p.hash[b])
		p.cached[b] = false
		p.ops = appendOp(p.ops, true, p.hash[b])
	}
	p.ref[b] = 1
	return b
}

// release drops one reference; at zero the block joins the free queue's tail.
func (p *blockPool) release(b int32) {
	p.ref[b]--
	if p.ref[b] == 0 {
		p.pushTail(b)
	}
}

// register enters a full block into the prefix cache (BlockStored). A hash
// another block already holds (two requests computed the same block at
// once) stays with the first block, as vLLM's lookup would find that one.
func (p *blockPool) register(b int32, h uint64) {
	if _, dup := p.byHash[h]; dup {
		return
	}
	p.hash[b], p.cached[b] = h, true
	p.byHash[h] = b
	p.ops = appendOp(p.ops, false, h)
}

// used is the number of blocks referenced by running sequences: vLLM's
// kv-cache usage counts cached-but-free blocks as free.
func (p *blockPool) used() int { return p.n - p.nFree }

// engine is one simulated vLLM pod: a waiting queue (FIFO), a running list
// in admission order, the block pool, and the step scheduler.
type engine struct {
	cfg     engineConfig
	pool    *blockPool
	waiting []*engineSeq // FIFO; preempted sequences go back to the front
	running []*engineSeq
	busy    bool
	stats   engineStats
	// stepSeqs are the sequences scheduled in the step in progress.
	stepSeqs   []*engineSeq
	hitScratch []int32
	decodeSeqs []*engineSeq // the step's decoding sequences (SharedKVReadOnce)
	// byReq finds a queued or running request for Abort; entries leave when
	// the request finishes or is aborted, so it holds at most the requests
	// inside the engine.
	byReq map[int]*engineSeq
}

// engineStats are an engine's lifetime counters.
type engineStats struct {
	Steps          int
	Preemptions    int
	MaxUsedBlocks  int
	PromptTokens   int64 // on first admission
	HitTokens      int64 // on first admission
	RecomputeToks  int64 // tokens prefilled again after preemptions
	PrefillTokens  int64 // prompt/recompute tokens computed
	DecodeTokens   int64
	BusySeconds    float64
	FinishedSeqs   int
	AbortedSeqs    int
	GeneratedToken int64
}

// newEngine builds an idle engine with an empty cache.
func newEngine(cfg engineConfig) (*engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &engine{cfg: cfg, pool: newBlockPool(cfg.KVBlocks), byReq: make(map[int]*engineSeq)}, nil
}

// add queues a request. hashes are its full prompt blocks at the engine's
// block size; salt distinguishes its generated blocks from anyone else's.
func (e *engine) add(req, promptLen, outputLen int, hashes []uint64, salt uint64) error {
	if promptLen < 1 || outputLen < 1 {
		return fmt.Errorf("engine: request %d needs prompt and output of >= 1 token", req)
	}
	if len(hashes) > promptLen/e.cfg.BlockSize {
		return fmt.Errorf("engine: request %d has %d block hashes for a %d-token prompt", req, len(hashes), promptLen)
	}
	if need := (promptLen + outputLen - 1 + e.cfg.BlockSize - 1) / e.cfg.BlockSize; need > e.cfg.KVBlocks {
		return fmt.Errorf("engine: request %d needs %d blocks, more than the pod's %d", req, need, e.cfg.KVBlocks)
	}
	if _, dup := e.byReq[req]; dup {
		return fmt.Errorf("engine: request %d added twice", req)
	}
	s := &engineSeq{req: req, promptLen: promptLen, outputLen: outputLen, hashes: hashes, outSalt: mix64(salt)}
	e.byReq[req] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// abort removes a request whose client went away (vLLM aborts a request
// when its HTTP connection closes): a queued one leaves the queue, a running
// one frees its blocks (its computed full blocks stay cached, as vLLM's
// freed blocks do). A request inside the step in progress leaves when the
// step finishes, without sampling. It reports whether the request was in
// the engine.
func (e *engine) abort(req int) bool {
	s, ok := e.byReq[req]
	if !ok {
		return false
	}
	s.aborted = true
	if !e.busy || s.scheduled == 0 {
		e.purgeAborted()
	}
	return true
}

// purgeAborted drops aborted sequences that are not part of a step in
// progress from the queue and the running list and frees their blocks.
func (e *engine) purgeAborted() {
	keep := func(list []*engineSeq) []*engineSeq {
		k := 0
		for _, s := range list {
			if s.aborted && s.scheduled == 0 {
				e.freeSeq(s)
				delete(e.byReq, s.req)
				e.stats.AbortedSeqs++
				continue
			}
			list[k] = s
			k++
		}
		clear(list[k:])
		return list[:k]
	}
	e.waiting = keep(e.waiting)
	e.running = keep(e.running)
}

// numWaiting is the number of queued requests (vLLM's num_requests_waiting).
func (e *engine) numWaiting() int { return len(e.waiting) }

// numRunning is the number of running sequences.
func (e *engine) numRunning() int { return len(e.running) }

// kvUsage is the share of blocks referenced by running sequences (vLLM's
// kv_cache_usage_perc / 100).
func (e *engine) kvUsage() float64 { return float64(e.pool.used()) / float64(e.pool.n) }

// usedBlocks is the number of referenced blocks.
func (e *engine) usedBlocks() int { return e.pool.used() }

// cachedBlocks is the number of blocks findable by hash.
func (e *engine) cachedBlocks() int { return len(e.pool.byHash) }

// statsNow returns the engine's counters.
func (e *engine) statsNow() engineStats { return e.stats }

// takeKVEvents returns the KV events since the last call (and forgets them).
func (e *engine) takeKVEvents() []kvOp {
	ops := e.pool.ops
	e.pool.ops = nil
	return ops
}

// blocksFor is the number of blocks that hold n tokens.
func (e *engine) blocksFor(n int) int { return (n + e.cfg.BlockSize - 1) / e.cfg.BlockSize }

// grow allocates blocks so s can hold n tokens; false (nothing allocated)
// when the free queue is too short.
func (e *engine) grow(s *engineSeq, n int) bool {
	need := e.blocksFor(n) - len(s.blocks)
	if need <= 0 {
		return true
	}
	if need > e.pool.nFree {
		return false
	}
	for ; need > 0; need-- {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
	return true
}

// freeSeq releases s's blocks, last block first, so that a finished
// request's tail is evicted before its (more shareable) head.
func (e *engine) freeSeq(s *engineSeq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	s.blocks = s.blocks[:0]
	s.registered = 0
}

// startStep schedules one step as vLLM's scheduler does and returns its
// duration; ok is false when there is nothing to run. Running sequences go
// first, in admission order: each gets its remaining tokens (a decode: 1; a
// prefill: a chunk) within the token budget; when its blocks cannot be
// allocated the most recently admitted running sequence is preempted
// (blocks freed, recompute later, back to the front of the queue), possibly
// itself. Then, unless something was preempted, waiting requests are
// admitted in FIFO order while the budget, max_num_seqs and the free blocks
// allow; the first that does not fit stops admission (no overtaking).
func (e *engine) startStep() (dur float64, ok bool) {
	if e.busy {
		return 0, false
	}
	budget := e.cfg.MaxNumBatchedTokens
	e.stepSeqs = e.stepSeqs[:0]
	prefill, decodes, decodeCtx := 0, 0, 0
	preempted := false
	e.decodeSeqs = e.decodeSeqs[:0]
	for i := 0; i < len(e.running) && budget > 0; {
		s := e.running[i]
		n := min(s.numTokens()-s.computed, budget)
		for !e.grow(s, s.computed+n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if i >= len(e.running) || e.running[i] != s {
			break // s itself was preempted: everything after it is gone too
		}
		s.scheduled = n
		e.stepSeqs = append(e.stepSeqs, s)
		budget -= n
		if s.computed >= s.promptLen && n == 1 {
			decodes++
			if e.readsShared() {
				e.decodeSeqs = append(e.decodeSeqs, s)
			}
			decodeCtx += s.computed + 1
		} else {
			prefill += n
		}
		i++
	}
	for !preempted && len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[0]
		e.hitScratch = e.prefixHit(s, e.hitScratch[:0])
		hitBlocks := len(e.hitScratch)
		hitTokens := hitBlocks * e.cfg.BlockSize
		n := min(s.numTokens()-hitTokens, budget)
		// Free blocks available = free queue minus the hit blocks this
		// admission takes out of it.
		avail := e.pool.nFree
		for _, b := range e.hitScratch {
			if e.pool.ref[b] == 0 {
				avail--
			}
		}
		if e.blocksFor(hitTokens+n)-hitBlocks > avail {
			break
		}
		for _, b := range e.hitScratch {
			e.pool.touch(b)
			s.blocks = append(s.blocks, b)
		}
		s.registered = hitBlocks
		s.computed = hitTokens
		e.grow(s, hitTokens+n)
		if !s.admitted {
			s.admitted = true
			e.stats.PromptTokens += int64(s.promptLen)
			s.hitTokens = min(hitTokens, s.promptLen)
			e.stats.HitTokens += int64(s.hitTokens)
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		s.scheduled = n
		e.stepSeqs = append(e.stepSeqs, s)
		budget -= n
		prefill += n
	}
	if len(e.stepSeqs) == 0 {
		return 0, false
	}
	e.busy = true
	e.stats.Steps++
	e.stats.MaxUsedBlocks = max(e.stats.MaxUsedBlocks, e.pool.used())
	if e.readsShared() {
		once := e.sharedContext()
		decodeCtx = once + int(math.Round(e.cfg.SharedKVReadShare*float64(decodeCtx-once)))
	}
	dur = e.cfg.stepTime(prefill, decodes, decodeCtx)
	e.stats.BusySeconds += dur
	e.stats.PrefillTokens += int64(prefill)
	e.stats.DecodeTokens += int64(decodes)
	return dur, true
}

// readsShared reports whether a step's KV reads depend on block sharing:
// with a read share of 1 every holder pays in full, as without
// SharedKVReadOnce, and the walk over the blocks is skipped.
func (e *engine) readsShared() bool {
	return e.cfg.SharedKVReadOnce && e.cfg.SharedKVReadShare < 1
}

// sharedContext is the context tokens the step's decoding sequences read
// when each shared block is read once: every block counts 1/ref of its
// tokens per holder (exact when all its holders are decoding in this step,
// an undercount of the read otherwise, by at most the blocks shared with
// sequences still in prefill).
func (e *engine) sharedContext() int {
	sum := 0.0
	for _, s := range e.decodeSeqs {
		n := s.computed + 1
		for k, b := range s.blocks {
			tok := min(e.cfg.BlockSize, n-k*e.cfg.BlockSize)
			if tok <= 0 {
				break
			}
			r := e.pool.ref[b]
			if r <= 1 {
				// Holders of block k+1 share the prefix through block k, so
				// a block only this sequence holds is followed by more of
				// them: the rest of the context counts in full.
				sum += float64(n - k*e.cfg.BlockSize)
				break
			}
			sum += float64(tok) / float64(r)
		}
	}
	return int(math.Round(sum))
}

// prefixHit appends the cached blocks holding the leading blocks of s,
// capped so at least one token is computed (vLLM recomputes the last token
// of a fully cached prompt to produce logits).
func (e *engine) prefixHit(s *engineSeq, out []int32) []int32 {
	limit := (s.numTokens() - 1) / e.cfg.BlockSize
	for k := 0; k < limit; k++ {
		b := e.pool.lookup(s.blockHash(k))
		if b < 0 {
			break
		}
		out = append(out, b)
	}
	return out
}

func (e *engine) preempt(s *engineSeq) {
	e.stats.Preemptions++
	s.preempted++
	e.stats.RecomputeToks += int64(s.computed)
	e.freeSeq(s)
	s.computed = 0
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
}

// seqProgress is what one step did for one request.
type seqProgress struct {
	Req        int
	NewToken   bool // the step sampled a token
	FirstToken bool // ... and it was the request's first
	Finished   bool // ... and it was the last (the request left the engine)
	Generated  int
	// On Finished: prompt tokens served from the prefix cache on first
	// admission, and how often the request was preempted.
	HitTokens, Preemptions int
}

// finishStep completes the step in progress: scheduled tokens are computed,
// newly full blocks enter the prefix cache, sequences whose tokens all are
// computed sample one token, and finished ones free their blocks. It appends
// one SeqProgress per sequence that sampled a token.
func (e *engine) finishStep(out []seqProgress) []seqProgress {
	e.busy = false
	finished := false
	aborted := false
	for _, s := range e.stepSeqs {
		if s.aborted {
			s.scheduled = 0
			aborted = true
			continue
		}
		s.computed += s.scheduled
		s.scheduled = 0
		for full := s.computed / e.cfg.BlockSize; s.registered < full; s.registered++ {
			e.pool.register(s.blocks[s.registered], s.blockHash(s.registered))
		}
		if s.computed < s.numTokens() {
			continue // prefill chunk, more to come
		}
		s.generated++
		e.stats.GeneratedToken++
		p := seqProgress{Req: s.req, NewToken: true, FirstToken: s.generated == 1, Generated: s.generated}
		if s.generated == s.outputLen {
			p.Finished = true
			p.HitTokens, p.Preemptions = s.hitTokens, s.preempted
			finished = true
			e.stats.FinishedSeqs++
			e.freeSeq(s)
			delete(e.byReq, s.req)
		}
		out = append(out, p)
	}
	if finished {
		k := 0
		for _, s := range e.running {
			if s.generated < s.outputLen {
				e.running[k] = s
				k++
			}
		}
		clear(e.running[k:])
		e.running = e.running[:k]
	}
	e.stepSeqs = e.stepSeqs[:0]
	if aborted {
		e.purgeAborted()
	}
	return out
}
