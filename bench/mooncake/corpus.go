package mooncake

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/sim"
)

// Config is one prepared workload: the trace's shape, the mock engines and
// how queries carry their request.
type Config struct {
	Shape
	// Capacity is each mock engine's GPU pool in blocks (mooncake_bench's
	// --num-gpu-blocks).
	Capacity int
	// BlockSize is tokens per block: the trace's 512 (one hash id, one block).
	BlockSize int
	// Tokens makes queries carry token ids (each block BlockSize copies of
	// its id, as mooncake_bench synthesizes a trace's tokens) that the
	// indexer turns into block keys; the engines' block hashes are then the
	// same keys (blockkeys, Algo). Without it queries carry the block
	// hashes, as find_matches is given them, and the engines' hashes are
	// the block ids through a 64-bit bijection.
	Tokens bool
	// Algo is the engines' --prefix-caching-hash-algo for Tokens.
	Algo blockkeys.HashAlgo
	// CopyCounts makes every BlockRemoved carry remaining_copy_counts (0:
	// a pool holds one copy of a block), so the applier need not count
	// copies itself (docs/wire-formats.md).
	CopyCounts bool
}

// DefaultConfig is mooncake_bench as the Flash Indexer post ran it
// (docs/performance.md): 256 workers of 16,384 blocks, the trace 16 times
// longer and 4 times over.
func DefaultConfig() Config {
	return Config{Shape: Shape{Workers: 256, LengthFactor: 16, DupFactor: 4, Seed: 42},
		Capacity: 16384, BlockSize: 512, Algo: blockkeys.AlgoSHA256}
}

// Model is the model name the engines publish for and queries name.
const Model = "mooncake/bench"

// KeyConfig is the engines' (and the indexer's) block-key config.
func (c Config) KeyConfig() blockkeys.KeyConfig {
	return blockkeys.KeyConfig{Algo: c.Algo, Seed: "0", BlockSize: c.BlockSize}
}

// Totals count a corpus in mooncake_bench's two units. A logical op is one
// request (a find_matches) or one event (BlockStored or BlockRemoved); a
// block op is one block hash in a request or in an event.
type Totals struct {
	Requests, StoredEvents, RemovedEvents      int64
	RequestBlocks, StoredBlocks, RemovedBlocks int64
	Batches                                    int64 // event batches (one vLLM message per request that changed its engine's pool)
}

// Logical is requests + stored + removed events.
func (t Totals) Logical() int64 { return t.Requests + t.StoredEvents + t.RemovedEvents }

// Blocks is request + stored + removed blocks (mooncake_bench today).
func (t Totals) Blocks() int64 { return t.RequestBlocks + t.StoredBlocks + t.RemovedBlocks }

// BlogBlocks is request + stored blocks: the denominator of the Flash
// Indexer post's figure (its harness counted no block for a removal).
func (t Totals) BlogBlocks() int64 { return t.RequestBlocks + t.StoredBlocks }

const (
	opQuery uint8 = iota
	opEvents
)

// op is one scheduled operation. pos is its time within its worker's
// timeline as a fraction of that timeline (0 = first entry, 1<<32-1 =
// last), so one corpus serves every replay window.
type op struct {
	pos    uint32
	worker uint32
	idx    uint32 // query or payload index
	kind   uint8
}

// Corpus is a prepared replay: the schedule, every query's input, every
// event batch as the vLLM message its engine would publish.
type Corpus struct {
	Cfg    Config
	Totals Totals
	// Resident is each mock engine's pool size after the last request: what
	// the index holds for that worker once every event is applied.
	Resident []int

	ops   []op
	qoff  []uint32 // query i is qkeys/qids[qoff[i]:qoff[i+1]]
	qkeys []uint64
	qids  []uint32
	poff  []uint64 // payload i is pay[poff[i]:poff[i+1]]
	pay   []byte
}

// Ops is the number of scheduled operations (queries + event batches).
func (c *Corpus) Ops() int { return len(c.ops) }

// Build replays each worker's requests through its mock engine and records
// the queries and the engines' event batches.
func Build(trace []sim.Request, cfg Config) (*Corpus, error) {
	if cfg.Capacity <= 0 || cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("mooncake: capacity and block size must be positive")
	}
	workers, err := Partition(trace, cfg.Shape)
	if err != nil {
		return nil, err
	}
	c := &Corpus{Cfg: cfg, Resident: make([]int, len(workers)), qoff: []uint32{0}, poff: []uint64{0}}
	keys, err := newKeyer(cfg, workers)
	if err != nil {
		return nil, err
	}
	var st Step
	var hashes []uint64
	evs := make([]event.Event, 0, 64)
	for w, reqs := range workers {
		if len(reqs) == 0 {
			continue
		}
		eng := NewEngine(cfg.Capacity)
		first, last := reqs[0].Timestamp, reqs[len(reqs)-1].Timestamp
		for _, r := range reqs {
			pos := uint32(0)
			if last > first {
				pos = uint32(math.Min(float64(r.Timestamp-first)/float64(last-first)*(1<<32), 1<<32-1))
			}
			if err := keys.ensure(r.HashIDs); err != nil {
				return nil, err
			}
			c.ops = append(c.ops, op{pos: pos, worker: uint32(w), idx: uint32(len(c.qoff) - 1), kind: opQuery})
			if cfg.Tokens {
				for _, id := range r.HashIDs {
					c.qids = append(c.qids, uint32(id))
				}
				c.qoff = append(c.qoff, uint32(len(c.qids)))
			} else {
				for _, id := range r.HashIDs {
					c.qkeys = append(c.qkeys, keys.key(id))
				}
				c.qoff = append(c.qoff, uint32(len(c.qkeys)))
			}
			c.Totals.Requests++
			c.Totals.RequestBlocks += int64(len(r.HashIDs))

			eng.Run(r.HashIDs, &st)
			if len(st.Evicted) == 0 && len(st.Runs) == 0 {
				continue
			}
			// One message per request, as the engine's publisher flushes
			// a step's events together: the evictions that made room (one
			// BlockRemoved per block, as the mock engine publishes them),
			// then the request's new blocks.
			hashes, evs = hashes[:0], evs[:0]
			for _, id := range st.Evicted {
				hashes = append(hashes, keys.key(id))
			}
			for i := range st.Evicted {
				ev := event.Event{Kind: event.BlockRemoved, BlockHashes: hashes[i : i+1 : i+1], Medium: event.TierGPU}
				if cfg.CopyCounts {
					ev.RemainingCopies, ev.HasRemainingCopies = zeroCopies, true
				}
				evs = append(evs, ev)
			}
			for _, run := range st.Runs {
				from := len(hashes)
				for _, id := range r.HashIDs[run.From:run.To] {
					hashes = append(hashes, keys.key(id))
				}
				ev := event.Event{Kind: event.BlockStored, BlockHashes: hashes[from:len(hashes):len(hashes)],
					BlockSize: cfg.BlockSize, Medium: event.TierGPU}
				if run.From > 0 {
					ev.ParentHash, ev.HasParent = keys.key(r.HashIDs[run.From-1]), true
				}
				evs = append(evs, ev)
				c.Totals.StoredEvents++
				c.Totals.StoredBlocks += int64(run.To - run.From)
			}
			c.Totals.RemovedEvents += int64(len(st.Evicted))
			c.Totals.RemovedBlocks += int64(len(st.Evicted))
			p, err := enginepub.EncodeVLLMBatch(&event.Batch{Timestamp: float64(r.Timestamp) / 1e3, Events: evs},
				enginepub.VLLMEncodeOptions{MapForm: true})
			if err != nil {
				return nil, err
			}
			c.ops = append(c.ops, op{pos: pos, worker: uint32(w), idx: uint32(len(c.poff) - 1), kind: opEvents})
			c.pay = append(c.pay, p...)
			c.poff = append(c.poff, uint64(len(c.pay)))
			c.Totals.Batches++
		}
		c.Resident[w] = eng.Resident()
	}
	if len(c.ops) >= math.MaxUint32 || len(c.qkeys) >= math.MaxUint32 || len(c.qids) >= math.MaxUint32 {
		return nil, fmt.Errorf("mooncake: corpus exceeds 32-bit indexes")
	}
	// Deadline order; at one deadline queries before events (mooncake_bench's
	// order), then by worker; the stable sort keeps each worker's order.
	slices.SortStableFunc(c.ops, func(a, b op) int {
		if a.pos != b.pos {
			return cmpU32(a.pos, b.pos)
		}
		if a.kind != b.kind {
			return int(a.kind) - int(b.kind)
		}
		return cmpU32(a.worker, b.worker)
	})
	return c, nil
}

var zeroCopies = []uint32{0}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// keyer gives each block id the hash its engine publishes: a bijection of
// the id, or with Tokens the vLLM block hash of the block's synthesized
// tokens chained to its parent's, computed once per id.
type keyer struct {
	cfg   Config
	h     *blockkeys.Hasher
	dlen  int
	dig   []byte // id -> digest (dlen bytes), with Tokens
	known []uint64
	buf   []byte
	toks  []uint32
	none  blockkeys.ExtraKeys
}

func newKeyer(cfg Config, workers [][]Request) (*keyer, error) {
	k := &keyer{cfg: cfg}
	if !cfg.Tokens {
		return k, nil
	}
	h, err := blockkeys.NewHasher(cfg.KeyConfig())
	if err != nil {
		return nil, err
	}
	var maxID uint64
	for _, reqs := range workers {
		for _, r := range reqs {
			for _, id := range r.HashIDs {
				maxID = max(maxID, id)
			}
		}
	}
	k.h, k.dlen = h, h.DigestLen()
	k.dig = make([]byte, (maxID+1)*uint64(k.dlen))
	k.known = make([]uint64, maxID/64+1)
	k.toks = make([]uint32, cfg.BlockSize)
	return k, nil
}

// ensure computes the digests of a request's blocks not seen before, in
// chain order (a block id always follows the same parent in the trace).
func (k *keyer) ensure(ids []uint64) error {
	if k.h == nil {
		return nil
	}
	root, rlen := k.h.Root()
	parent := root[:rlen]
	for _, id := range ids {
		d := k.dig[id*uint64(k.dlen) : (id+1)*uint64(k.dlen)]
		if k.known[id/64]&(1<<(id%64)) == 0 {
			Tokens(k.toks, id)
			var sum [32]byte
			var err error
			if k.buf, sum, err = k.h.BlockDigest(k.buf, parent, k.toks, &k.none); err != nil {
				return err
			}
			copy(d, sum[:k.dlen])
			k.known[id/64] |= 1 << (id % 64)
		}
		parent = d
	}
	return nil
}

func (k *keyer) key(id uint64) uint64 {
	if k.h == nil {
		return mix64(id + golden)
	}
	var d [32]byte
	copy(d[:], k.dig[id*uint64(k.dlen):(id+1)*uint64(k.dlen)])
	return uint64(k.h.DigestKey(&d))
}

// Tokens fills block with the synthesized token ids of block id: the id,
// repeated (mooncake_bench synthesizes a trace's tokens the same way).
func Tokens(block []uint32, id uint64) {
	for j := range block {
		block[j] = uint32(id)
	}
}
