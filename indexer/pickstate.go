package indexer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/routing"
	"github.com/kvindex/kvindex/kvevents/event"
)

// PickConfig configures Pick: its policies, speculative entries and the
// routing history of pods without events. The zero value is the documented
// defaults.
type PickConfig struct {
	// DefaultPolicy answers a Pick that names none ("" = routing.DefaultPolicy).
	DefaultPolicy string
	// Params are the policies' knobs (nil = routing.Defaults()).
	Params *routing.Params
	// SpeculativeTTL is how long the pod a Pick chose is assumed to hold the
	// request's blocks before its own events say so (0 =
	// Options.SpeculativeTTL's default; negative turns speculation off).
	SpeculativeTTL time.Duration
	// SpeculativeCapacity bounds the in-process speculative entries
	// ((block, pod) pairs; 0 = Options.SpeculativeCapacity's default).
	SpeculativeCapacity int
	// HistoryTTL is how long a pick is remembered for candidates without
	// KV events (0 = Options.HistoryTTL's default; negative turns the
	// routing history off).
	HistoryTTL time.Duration
	// HistoryCapacity bounds the routing history ((block, pod) pairs;
	// 0 = Options.HistoryCapacity's default).
	HistoryCapacity int
	// Now is the clock of both TTLs (nil = time.Now); tests and the
	// simulator inject theirs.
	Now func() time.Time
}

// maxHoldCapacity bounds either hold map (Options.HistoryCapacity).
const maxHoldCapacity = 1 << 26

// SpeculativeStore holds speculative entries where several daemons see
// them (one index in Redis, several daemons). Holders are holderIDs, the
// same in every daemon. Every method is safe for concurrent use.
type SpeculativeStore interface {
	// Extend sets ext[i] to how many consecutive blocks from keys[start[i]]
	// are held speculatively by holders[i].
	Extend(ctx context.Context, model string, keys []blockkeys.Key, holders []uint64, start, ext []int32) error
	// Hold records holder for keys for the store's TTL.
	Hold(ctx context.Context, model string, keys []blockkeys.Key, holder uint64) error
	// Drop removes the entries of either holder (a pod named with and
	// without its rank) for the blocks whose engine hashes are given: its
	// real events for them arrived.
	Drop(ctx context.Context, model string, hashes []uint64, holders [2]uint64) error
}

// picker is Pick's state beside the index: the policies, the speculative
// store and the routing history.
type picker struct {
	order []routing.Policy // index = policy number in metrics
	def   int
	now   func() time.Time
	// spec is the speculative store (nil = off); specMem is set when it is
	// the in-process one, whose emptiness Pick checks for free.
	spec    SpeculativeStore
	specMem *holdMap
	hist    *holdMap // nil = off
}

// newPicker builds the pick state. shared returns the store speculative
// entries are shared through (Redis), or nil to keep them in process.
func newPicker(cfg PickConfig, shared func(ttl time.Duration) (SpeculativeStore, error)) (*picker, error) {
	params := routing.Defaults()
	if cfg.Params != nil {
		params = *cfg.Params
	}
	p := &picker{now: cfg.Now}
	if p.now == nil {
		p.now = time.Now
	}
	def := cfg.DefaultPolicy
	if def == "" {
		def = routing.DefaultPolicy
	}
	p.def = -1
	for _, name := range routing.Names() {
		pol, err := routing.New(name, params)
		if err != nil {
			return nil, fmt.Errorf("indexer: pick: %w", err)
		}
		if name == def {
			p.def = len(p.order)
		}
		p.order = append(p.order, pol)
	}
	if p.def < 0 {
		_, err := routing.New(def, params)
		return nil, fmt.Errorf("indexer: pick: default policy: %w", err)
	}
	// The TTLs and capacities come resolved and checked (options.go).
	if ttl := cfg.SpeculativeTTL; ttl > 0 {
		s, err := shared(ttl)
		if err != nil {
			return nil, fmt.Errorf("indexer: pick: speculative store: %w", err)
		}
		p.spec = s
		if p.spec == nil {
			p.specMem = newHoldMap(int64(ttl), cfg.SpeculativeCapacity)
			p.spec = &memSpec{h: p.specMem, now: p.now}
		}
	}
	if ttl := cfg.HistoryTTL; ttl > 0 {
		p.hist = newHoldMap(int64(ttl), cfg.HistoryCapacity)
	}
	return p, nil
}

// memSpec is the in-process SpeculativeStore.
type memSpec struct {
	h   *holdMap
	now func() time.Time
}

func (m *memSpec) Extend(_ context.Context, model string, keys []blockkeys.Key, holders []uint64, start, ext []int32) error {
	m.h.extend(modelHash(model), keys, holders, start, ext, m.now().UnixNano())
	return nil
}

func (m *memSpec) Hold(_ context.Context, model string, keys []blockkeys.Key, holder uint64) error {
	m.h.hold(modelHash(model), keys, holder, m.now().UnixNano())
	return nil
}

func (m *memSpec) Drop(_ context.Context, model string, hashes []uint64, holders [2]uint64) error {
	mh := modelHash(model)
	m.h.drop(mh, hashes, holders[0])
	m.h.drop(mh, hashes, holders[1])
	return nil
}

// dropAnswered drops the speculative entries the events of b answer: a
// BlockStored replaces the pod's speculative entry with a real one, a
// BlockRemoved contradicts it.
func (x *Indexer) dropAnswered(ctx context.Context, b *event.Batch) {
	p := x.pick
	if p.spec == nil || (p.specMem != nil && p.specMem.len() == 0) {
		return
	}
	// The router may have named the pod with or without its rank. Every
	// event's hashes go in one Drop: with the shared store that is one
	// round trip per batch, not one per event and holder.
	holders := [2]uint64{holderID(b.Pod, b.DPRank), holderID(b.Pod, -1)}
	var hashes []uint64
	var buf *[]uint64
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind != event.BlockStored && ev.Kind != event.BlockRemoved || len(ev.BlockHashes) == 0 {
			continue
		}
		switch {
		case hashes == nil:
			hashes = ev.BlockHashes // the common batch: one event, no copy
		case buf == nil:
			buf = dropBufs.Get().(*[]uint64)
			*buf = append(append((*buf)[:0], hashes...), ev.BlockHashes...)
			hashes = *buf
		default:
			*buf = append(*buf, ev.BlockHashes...)
			hashes = *buf
		}
	}
	if err := p.spec.Drop(ctx, b.Model, hashes, holders); err != nil {
		x.m.specErrors.Inc() // the entries expire by their TTL anyway
	}
	if buf != nil && cap(*buf) <= maxDropBuf {
		dropBufs.Put(buf)
	}
}

// dropBufs gathers the hashes of a batch's events for one Drop; a buffer
// grown past maxDropBuf (a batch of unusual size) is left to the GC.
var dropBufs = sync.Pool{New: func() any { return new([]uint64) }}

const maxDropBuf = 1 << 16
