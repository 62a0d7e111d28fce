package indexer

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// PredictionConfig turns on the prediction check: a scored request names
// the blocks it will make its engine store (its full blocks past the
// longest cached prefix). For a sample of scored requests those keys are
// remembered, and the engines' BlockStored events either bring them within
// Window (seen) or not (missed). A chat template, tokenizer or hash setting
// that differs from the engine's makes every prediction wrong: the miss rate
// goes to ~100% instead of routing silently degrading.
type PredictionConfig struct {
	// SampleRate is the fraction of scored requests checked, in [0, 1];
	// 0 turns the check off (nothing is wrapped or counted).
	SampleRate float64
	// Window is how long a predicted block may take to be stored; 0 =
	// DefaultPredictionWindow. It must cover queueing and prefill.
	Window time.Duration
	// Capacity bounds the predicted blocks awaited at once; 0 =
	// DefaultPredictionCapacity. Predictions beyond it are dropped and
	// counted (kvindexd_prediction_dropped_total).
	Capacity int
}

// Defaults for PredictionConfig zero values.
const (
	DefaultPredictionWindow   = 30 * time.Second
	DefaultPredictionCapacity = 1 << 16
)

// minHintBlocks is how many settled predictions a model needs before its
// miss rate is trusted for a hint.
const minHintBlocks = 32

type predKey struct {
	model kvindex.ModelID
	key   blockkeys.Key
}

type predEntry struct {
	k        predKey
	deadline int64 // unix nanoseconds
}

type predCounts struct {
	predicted, seen, missed, pending uint64
}

// predictor holds the awaited keys. Memory is bounded by Capacity: the
// FIFO (which also holds entries already seen, until their deadline) never
// exceeds it, and the pending maps hold a subset of the FIFO. The per-model
// counts are keyed by model ids the interner already knows.
type predictor struct {
	rate     float64
	window   time.Duration
	capacity int
	in       *kvindex.Interner
	now      func() time.Time
	rand     func() float64
	// awaiting mirrors nPending: the apply path returns on 0 without
	// taking the lock.
	awaiting atomic.Int64

	mu sync.Mutex
	// pending holds each awaited key's deadline, per model: a plain
	// uint64-keyed map is the fastest lookup Go has, which the apply path
	// pays per stored block while keys are awaited.
	pending  map[kvindex.ModelID]map[blockkeys.Key]int64
	nPending int
	fifo     []predEntry // by deadline; fifo[head:] is live
	head     int
	models   map[kvindex.ModelID]*predCounts
	dropped  uint64
}

func newPredictor(cfg PredictionConfig, in *kvindex.Interner, reg *prometheus.Registry) (*predictor, error) {
	// cfg comes resolved and checked (options.go).
	p := &predictor{rate: cfg.SampleRate, window: cfg.Window, capacity: cfg.Capacity, in: in,
		now: time.Now, rand: rand.Float64, pending: map[kvindex.ModelID]map[blockkeys.Key]int64{}, models: map[kvindex.ModelID]*predCounts{}}
	if reg != nil {
		if err := reg.Register(predCollector{p}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// sample remembers, for a sampled request, the keys r predicts: those past
// the longest prefix some pod already holds (held blocks are not stored
// again, so they predict no event).
func (p *predictor) sample(model kvindex.ModelID, r *Result) {
	if p.rate < 1 && p.rand() >= p.rate {
		return
	}
	held := 0
	for i := range r.Pods {
		held = max(held, r.Pods[i].MatchedBlocks)
	}
	if held >= len(r.keys) {
		return
	}
	now := p.now().UnixNano()
	deadline := now + int64(p.window)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(now)
	c := p.counts(model)
	pm := p.pending[model]
	if pm == nil {
		pm = map[blockkeys.Key]int64{}
		p.pending[model] = pm
	}
	for _, k := range r.keys[held:] {
		if _, ok := pm[k]; ok {
			continue // already awaited for an earlier request
		}
		if len(p.fifo)-p.head >= p.capacity {
			p.dropped++
			continue
		}
		pm[k] = deadline
		p.fifo = append(p.fifo, predEntry{predKey{model, k}, deadline})
		p.nPending++
		c.predicted++
		c.pending++
	}
	p.awaiting.Store(int64(p.nPending))
}

// observe settles awaited keys that an engine just stored. It runs on the
// apply path: without awaited keys it is one atomic load, and it never
// allocates.
func (p *predictor) observe(model kvindex.ModelID, keys []blockkeys.Key) {
	if p.awaiting.Load() == 0 {
		return
	}
	var now int64
	p.mu.Lock()
	pm := p.pending[model]
	for _, k := range keys {
		deadline, ok := pm[k]
		if !ok {
			continue
		}
		if now == 0 {
			now = p.now().UnixNano()
		}
		delete(pm, k)
		p.nPending--
		c := p.models[model]
		c.pending--
		if now <= deadline {
			c.seen++
		} else {
			c.missed++ // arrived, but after the window: counted as the window says
		}
	}
	p.awaiting.Store(int64(p.nPending))
	p.mu.Unlock()
}

// expire counts awaited keys past their deadline as missed. Caller holds mu.
func (p *predictor) expire(now int64) {
	for p.head < len(p.fifo) && p.fifo[p.head].deadline < now {
		e := p.fifo[p.head]
		p.fifo[p.head] = predEntry{}
		p.head++
		pm := p.pending[e.k.model]
		if d, ok := pm[e.k.key]; ok && d == e.deadline {
			delete(pm, e.k.key)
			p.nPending--
			c := p.models[e.k.model]
			c.pending--
			c.missed++
		}
	}
	if p.head > 0 && p.head >= len(p.fifo)/2 {
		n := copy(p.fifo, p.fifo[p.head:])
		clear(p.fifo[n:])
		p.fifo = p.fifo[:n]
		p.head = 0
	}
	p.awaiting.Store(int64(p.nPending))
}

func (p *predictor) counts(model kvindex.ModelID) *predCounts {
	c := p.models[model]
	if c == nil {
		c = &predCounts{}
		p.models[model] = c
	}
	return c
}

// ModelPrediction is one model's prediction check.
type ModelPrediction struct {
	Model string
	// Predicted blocks so far; each ends Seen (stored within the window),
	// Missed, or is still Pending.
	Predicted, Seen, Missed, Pending uint64
	// MissRate is Missed / (Seen + Missed); 0 before anything settled.
	MissRate float64
	// Hint explains a high miss rate once enough blocks settled.
	Hint string
}

// Predictions lists the prediction check per model, sorted by name; nil
// when the check is off.
func (ix *Indexer) Predictions() []ModelPrediction {
	if ix.pred == nil {
		return nil
	}
	return ix.pred.snapshot()
}

// PredictionEnabled reports whether scored requests are sampled.
func (ix *Indexer) PredictionEnabled() bool { return ix.pred != nil }

func (p *predictor) snapshot() []ModelPrediction {
	p.mu.Lock()
	p.expire(p.now().UnixNano())
	out := make([]ModelPrediction, 0, len(p.models))
	for id, c := range p.models {
		mp := ModelPrediction{Model: p.in.ModelName(id), Predicted: c.predicted, Seen: c.seen, Missed: c.missed, Pending: c.pending}
		if settled := c.seen + c.missed; settled > 0 {
			mp.MissRate = float64(c.missed) / float64(settled)
			if settled >= minHintBlocks && mp.MissRate >= 0.9 {
				mp.Hint = "almost no block kvindex predicts for scored requests is later stored by an engine: the chat template, " +
					"tokenizer, LoRA/cache_salt naming or hash settings likely differ from the engine's (compare `kvindexd render` " +
					"with the engine's prompt and check parity in /v1/pods); or requests are not routed to engines after scoring, " +
					"or prefix caching is off"
			}
		}
		out = append(out, mp)
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// observedIndex is the index as the applier sees it: every successful Add
// is shown to the predictor.
type observedIndex struct {
	kvindex.Index
	p *predictor
}

func (o observedIndex) Add(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	if err := o.Index.Add(ctx, model, pod, tier, keys); err != nil {
		return err
	}
	o.p.observe(model, keys)
	return nil
}

// observedHeld is the backend's Held (kvindex.HeldAdder) with its
// successful writes shown to the predictor too: the applier writes stored
// blocks through it when the backend has one.
type observedHeld struct {
	h kvindex.HeldAdder
	p *predictor
}

func (o observedHeld) AddHeld(ctx context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key, held []bool) error {
	if err := o.h.AddHeld(ctx, model, pod, tier, keys, held); err != nil {
		return err
	}
	o.p.observe(model, keys)
	return nil
}

// observe wraps idx and held (nil: none) so that their successful writes
// of stored blocks are shown to p.
func observe(idx kvindex.Index, held kvindex.HeldAdder, p *predictor) (kvindex.Index, kvindex.HeldAdder) {
	if held != nil {
		held = observedHeld{h: held, p: p}
	}
	return observedIndex{Index: idx, p: p}, held
}

var (
	descPredSeen      = prometheus.NewDesc("kvindexd_prediction_blocks_seen_total", "Predicted blocks of sampled score requests that an engine stored within the window.", []string{"model"}, nil)
	descPredMissed    = prometheus.NewDesc("kvindexd_prediction_blocks_missed_total", "Predicted blocks of sampled score requests that no engine stored within the window.", []string{"model"}, nil)
	descPredPredicted = prometheus.NewDesc("kvindexd_prediction_blocks_predicted_total", "Blocks predicted by sampled score requests.", []string{"model"}, nil)
	descPredPending   = prometheus.NewDesc("kvindexd_prediction_pending_blocks", "Predicted blocks awaited now (bounded by the prediction capacity).", nil, nil)
	descPredDropped   = prometheus.NewDesc("kvindexd_prediction_dropped_total", "Predicted blocks not tracked because the table was full.", nil, nil)
)

// predCollector reads the counts at scrape time, settling expired keys
// first so a scrape sees misses as soon as their window passed.
type predCollector struct{ p *predictor }

func (c predCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPredSeen, descPredMissed, descPredPredicted, descPredPending, descPredDropped} {
		ch <- d
	}
}

func (c predCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	p.mu.Lock()
	p.expire(p.now().UnixNano())
	pending, dropped := p.nPending, p.dropped
	type row struct {
		name string
		c    predCounts
	}
	rows := make([]row, 0, len(p.models))
	for id, cnt := range p.models {
		rows = append(rows, row{p.in.ModelName(id), *cnt})
	}
	p.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(descPredSeen, prometheus.CounterValue, float64(r.c.seen), r.name)
		ch <- prometheus.MustNewConstMetric(descPredMissed, prometheus.CounterValue, float64(r.c.missed), r.name)
		ch <- prometheus.MustNewConstMetric(descPredPredicted, prometheus.CounterValue, float64(r.c.predicted), r.name)
	}
	ch <- prometheus.MustNewConstMetric(descPredPending, prometheus.GaugeValue, float64(pending))
	ch <- prometheus.MustNewConstMetric(descPredDropped, prometheus.CounterValue, float64(dropped))
}
