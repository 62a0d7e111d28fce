package indexer

import (
	"context"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// clock is a settable time source for the prediction window.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newPredIndexer(t *testing.T, cfg PredictionConfig) (*Indexer, *clock, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Prediction: cfg, Registry: reg})
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	ix.pred.now = c.now
	return ix, c, reg
}

func gauge(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i, lp := range m.GetLabel() {
				if i*2+1 >= len(labels) || lp.GetName() != labels[i*2] || lp.GetValue() != labels[i*2+1] {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s%v", name, labels)
	return 0
}

func predictionOf(t *testing.T, ix *Indexer, model string) ModelPrediction {
	t.Helper()
	for _, p := range ix.Predictions() {
		if p.Model == model {
			return p
		}
	}
	t.Fatalf("no prediction entry for %s in %+v", model, ix.Predictions())
	return ModelPrediction{}
}

// A scored request predicts its blocks past the cached prefix; an engine
// storing them within the window counts them seen, blocks never stored
// count missed once the window passed, and late arrivals count missed too.
func TestPredictionSeenAndMissed(t *testing.T) {
	ix, c, reg := newPredIndexer(t, PredictionConfig{SampleRate: 1, Window: 10 * time.Second})
	shared := seqTokens(100, 3*testBlock)
	apply(ix, "pod-a", 0, storeEvent(shared, 3, event.TierGPU)) // makes the model known
	var r Result
	req := append(append([]uint32(nil), shared...), seqTokens(900, 5*testBlock)...) // 3 cached + 5 new blocks
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: req}, &r)
	if p := predictionOf(t, ix, testModel); p.Predicted != 5 || p.Pending != 5 {
		t.Fatalf("after scoring: %+v, want 5 predicted (the cached 3 predict nothing)", p)
	}
	// The engine serves it and stores 4 of the 5 new blocks in time.
	apply(ix, "pod-a", 0, storeEvent(req, 7, event.TierGPU))
	if p := predictionOf(t, ix, testModel); p.Seen != 4 || p.Pending != 1 || p.Missed != 0 {
		t.Fatalf("after storing: %+v", p)
	}
	c.t = c.t.Add(11 * time.Second)
	p := predictionOf(t, ix, testModel)
	if p.Seen != 4 || p.Missed != 1 || p.Pending != 0 || p.MissRate != 0.2 {
		t.Fatalf("after the window: %+v", p)
	}
	// A block stored after its window is a miss.
	other := seqTokens(5000, 2*testBlock)
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: other}, &r)
	c.t = c.t.Add(11 * time.Second)
	apply(ix, "pod-a", 0, storeEvent(other, 2, event.TierGPU))
	if p := predictionOf(t, ix, testModel); p.Missed != 3 || p.Seen != 4 {
		t.Fatalf("late arrival: %+v", p)
	}
	if got := gauge(t, reg, "kvindexd_prediction_blocks_seen_total", "model", testModel); got != 4 {
		t.Errorf("seen metric %v", got)
	}
	if got := gauge(t, reg, "kvindexd_prediction_blocks_missed_total", "model", testModel); got != 3 {
		t.Errorf("missed metric %v", got)
	}
	// An unknown model is not sampled: its name is the request's, and
	// interning it would grow a table from request input.
	mustScore(t, ix, &Query{Model: "never/published", Kind: InputTokens, TokenIDs: other}, &r)
	if len(ix.Predictions()) != 1 {
		t.Errorf("unknown model sampled: %+v", ix.Predictions())
	}
}

// The table of awaited blocks has a cap: predictions beyond it are dropped
// and counted, and the pending gauge never exceeds it.
func TestPredictionCapacity(t *testing.T) {
	ix, c, reg := newPredIndexer(t, PredictionConfig{SampleRate: 1, Window: time.Second, Capacity: 6})
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, testBlock), 1, event.TierGPU))
	var r Result
	for i := range 4 {
		mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(1000*(i+1), 4*testBlock)}, &r)
	}
	if got := gauge(t, reg, "kvindexd_prediction_pending_blocks"); got != 6 {
		t.Fatalf("pending %v, want the cap 6", got)
	}
	if got := gauge(t, reg, "kvindexd_prediction_dropped_total"); got != 10 {
		t.Fatalf("dropped %v, want 10 of 16", got)
	}
	// Seen keys leave the FIFO only at their deadline, and the FIFO is what
	// the cap bounds: storing them does not let more in before then.
	apply(ix, "pod-b", 0, storeEvent(seqTokens(1000, 4*testBlock), 4, event.TierGPU))
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(9000, 2*testBlock)}, &r)
	if got := gauge(t, reg, "kvindexd_prediction_dropped_total"); got != 12 {
		t.Fatalf("dropped %v after seen keys, want 12", got)
	}
	// After the window everything settles and the table is free again.
	c.t = c.t.Add(2 * time.Second)
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(9000, 2*testBlock)}, &r)
	if got := gauge(t, reg, "kvindexd_prediction_pending_blocks"); got != 2 {
		t.Fatalf("pending %v after the window, want 2", got)
	}
	ix.pred.mu.Lock()
	fifo := len(ix.pred.fifo) - ix.pred.head
	ix.pred.mu.Unlock()
	if fifo != 2 {
		t.Fatalf("fifo holds %d entries, want 2", fifo)
	}
	p := predictionOf(t, ix, testModel)
	if p.Seen != 4 || p.Missed != 2 || p.Pending != 2 {
		t.Fatalf("%+v", p)
	}
}

// Sampling is off by default: the applier's index is not wrapped and no
// metric is registered.
func TestPredictionOffByDefault(t *testing.T) {
	reg := prometheus.NewRegistry()
	ix := newTestIndexer(t, Config{Registry: reg})
	if ix.pred != nil || ix.PredictionEnabled() || ix.Predictions() != nil {
		t.Fatal("prediction on without a sample rate")
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "kvindexd_prediction_pending_blocks" {
			t.Fatal("prediction metrics registered while off")
		}
	}
	if _, err := New(context.Background(), Config{Keys: testKeys, Prediction: PredictionConfig{SampleRate: 1.5}}); err == nil {
		t.Fatal("sample rate 1.5 accepted")
	}
}

// The apply-path hook allocates nothing, with and without awaited keys.
func TestPredictionObserveDoesNotAllocate(t *testing.T) {
	ix, _, _ := newPredIndexer(t, PredictionConfig{SampleRate: 1})
	keys := make([]blockkeys.Key, 64)
	for i := range keys {
		keys[i] = blockkeys.Key(i + 1)
	}
	if n := testing.AllocsPerRun(100, func() { ix.pred.observe(1, keys) }); n != 0 {
		t.Fatalf("observe with nothing awaited: %v allocs", n)
	}
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, testBlock), 1, event.TierGPU))
	var r Result
	mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(7000, 8*testBlock)}, &r)
	if ix.pred.awaiting.Load() == 0 {
		t.Fatal("nothing awaited")
	}
	if n := testing.AllocsPerRun(100, func() { ix.pred.observe(1, keys) }); n != 0 {
		t.Fatalf("observe with awaited keys: %v allocs", n)
	}
}

// A sample rate below 1 checks about that fraction of requests.
func TestPredictionSampleRate(t *testing.T) {
	ix, _, _ := newPredIndexer(t, PredictionConfig{SampleRate: 0.25, Capacity: 1 << 20})
	apply(ix, "pod-a", 0, storeEvent(seqTokens(1, testBlock), 1, event.TierGPU))
	var r Result
	const n = 2000
	for i := range n {
		mustScore(t, ix, &Query{Model: testModel, Kind: InputTokens, TokenIDs: seqTokens(10+i*testBlock, testBlock)}, &r)
	}
	got := predictionOf(t, ix, testModel).Predicted
	if got < n*0.15 || got > n*0.35 {
		t.Fatalf("%d of %d requests sampled at rate 0.25", got, n)
	}
}
