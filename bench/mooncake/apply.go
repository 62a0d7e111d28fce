package mooncake

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
)

// ApplyResult is ApplyAll's fixed amount of work and what it cost.
type ApplyResult struct {
	Batches, Blocks int64 // event messages applied; stored + removed blocks in them
	Wall, CPU       time.Duration
	// PodEntries is what the index holds per worker afterwards.
	PodEntries   []int64
	DecodeErrors int64
}

// ApplyAll decodes and applies every event message of c, in schedule
// order, on the calling goroutine, against a fresh indexer: the replay's
// event path (decode, applier, index) as a fixed amount of work with no
// queries, no issuer and no timing of its own. Its CPU time per block is
// comparable across builds where the replay's open-loop throughput,
// sharing two cores with everything else, is not; a CPU profile of it is
// the event path alone.
func ApplyAll(ctx context.Context, c *Corpus) (*ApplyResult, error) {
	runtime.GC()
	e, err := newEnv(ctx, c)
	if err != nil {
		return nil, err
	}
	defer e.ix.Close()
	sink := e.ix.Sink()
	var b event.Batch
	r := &ApplyResult{}
	var ru0, ru1 cpuTime
	ru0.read()
	t0 := time.Now()
	for _, o := range c.ops {
		if o.kind != opEvents {
			continue
		}
		if _, err := kvevents.Decode(c.pay[c.poff[o.idx]:c.poff[o.idx+1]], blockkeys.EngineVLLM, &b); err != nil {
			r.DecodeErrors++
			continue
		}
		b.Pod, b.Model, b.Engine, b.Seq = e.pods[o.worker], Model, blockkeys.EngineVLLM, uint64(o.idx)
		if out := sink.Apply(ctx, &b); out.IndexFailed {
			return nil, fmt.Errorf("mooncake: applying message %d failed in the index", o.idx)
		}
		r.Batches++
	}
	r.Wall = time.Since(t0)
	ru1.read()
	r.CPU = ru1.sub(ru0)
	r.Blocks = c.Totals.StoredBlocks + c.Totals.RemovedBlocks
	r.PodEntries = e.podEntries()
	return r, nil
}
