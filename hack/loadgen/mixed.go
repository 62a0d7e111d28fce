package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The mixed scenario (--publishers N > 0): N engines publish BlockStored
// batches with token ids at a steady rate while the gRPC clients score, the
// combined load a daemon serving a fleet sees. Each engine is one pod with
// its own ZMQ connection; a batch is one engine step that stores
// --step-blocks new blocks chained to its previous step and evicts half as
// many older ones, so the index stays bounded. Afterwards it reads the
// daemon's /metrics to report overflows, reader waits and the blocks the
// daemon applied per second.

// engineStream is one engine's pre-encoded steady state, replayed in a cycle
// with increasing sequence numbers.
func engineStream(o options, h *blockkeys.Hasher, seed uint64) ([][]byte, error) {
	const chunks, lag = 64, 8
	per := o.stepBlocks
	rng := rand.New(rand.NewPCG(seed, 99))
	tokens := make([]uint32, chunks*per*o.blockSize)
	for i := range tokens {
		tokens[i] = uint32(rng.IntN(150000))
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	evict := max(per/2, 1)
	var out [][]byte
	for c := 0; c < chunks; c++ {
		st := event.Event{Kind: event.BlockStored, BlockSize: o.blockSize, Medium: event.TierGPU,
			TokenIDs: tokens[c*per*o.blockSize : (c+1)*per*o.blockSize]}
		for _, k := range keys[c*per : (c+1)*per] {
			st.BlockHashes = append(st.BlockHashes, uint64(k))
		}
		if c > 0 {
			st.ParentHash, st.HasParent = uint64(keys[c*per-1]), true
		}
		old := (c - lag + chunks) % chunks
		rm := event.Event{Kind: event.BlockRemoved, Medium: event.TierGPU}
		for _, k := range keys[(old+1)*per-evict : (old+1)*per] {
			rm.BlockHashes = append(rm.BlockHashes, uint64(k))
		}
		p, err := enginepub.EncodeVLLMBatch(&event.Batch{Timestamp: 1.7e9, Events: []event.Event{st, rm}}, enginepub.VLLMEncodeOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// runEngines publishes until ctx ends; it returns the blocks sent.
func runEngines(ctx context.Context, o options, h *blockkeys.Hasher) (*atomic.Int64, func() error, error) {
	var sent atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, o.publishers)
	interval := time.Duration(float64(time.Second) * float64(o.stepBlocks) / o.engineRate)
	for e := 0; e < o.publishers; e++ {
		payloads, err := engineStream(o, h, uint64(e)+1)
		if err != nil {
			return nil, nil, err
		}
		pub, err := enginepub.NewPublisher(o.zmq, false)
		if err != nil {
			return nil, nil, err
		}
		topic := fmt.Sprintf("kv@mixed-engine-%03d@%s", e, o.model)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = pub.WaitSubscribed(wctx, topic)
		cancel()
		if err != nil {
			pub.Close()
			return nil, nil, fmt.Errorf("daemon is not subscribed on %s: %w", o.zmq, err)
		}
		wg.Go(func() {
			defer pub.Close()
			start := time.Now()
			var seq uint64
			for {
				// Catch up to the schedule, then sleep to the next step.
				due := uint64(time.Since(start) / interval)
				for ; seq <= due; seq++ {
					if err := pub.Publish(topic, seq, payloads[seq%uint64(len(payloads))]); err != nil {
						errs <- err
						return
					}
					sent.Add(int64(o.stepBlocks))
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(start.Add(time.Duration(seq) * interval))):
				}
			}
		})
	}
	wait := func() error {
		wg.Wait()
		close(errs)
		return <-errs
	}
	return &sent, wait, nil
}

// daemonCounters reads the counters the mixed report needs from /metrics.
func daemonCounters(o options) (map[string]float64, error) {
	resp, err := http.Get("http://" + o.httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{
		"kvindexd_kvevents_queue_overflows_total": true, "kvindexd_kvevents_queue_waits_total": true,
		"kvindexd_kvevents_seq_gaps_total": true, "kvindexd_kvevents_missed_batches_total": true,
		"kvindexd_blocks_stored_total": true, "kvindexd_parity_matches_total": true,
		"kvindexd_parity_sampled_out_total": true, "kvindexd_parity_mismatches_total": true,
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

func runMixed(o options, h *blockkeys.Hasher, prompts [][]uint32) error {
	before, err := daemonCounters(o)
	if err != nil {
		return fmt.Errorf("read daemon metrics: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sent, wait, err := runEngines(ctx, o, h)
	if err != nil {
		cancel()
		return err
	}
	fmt.Printf("mixed: %d engines x %.0f blocks/s (steps of %d blocks with token ids) while scoring\n",
		o.publishers, o.engineRate, o.stepBlocks)
	t0 := time.Now()
	field := o.tokenField
	if field == "both" {
		field = "packed"
	}
	scoreErr := measureGRPC(o, prompts, nil, field)
	cancel()
	if err := wait(); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	elapsed := time.Since(t0)
	time.Sleep(500 * time.Millisecond) // let the daemon apply what is queued
	after, err := daemonCounters(o)
	if err != nil {
		return fmt.Errorf("read daemon metrics: %w", err)
	}
	d := func(k string) float64 { return after[k] - before[k] }
	// Every stored block with token ids is either parity-checked or sampled
	// out, so their sum is the stored blocks the daemon processed; the
	// stored counter only counts keys new to the index (the engines' cycle
	// re-stores blocks it did not evict).
	processed := d("kvindexd_parity_matches_total") + d("kvindexd_parity_sampled_out_total") + d("kvindexd_parity_mismatches_total")
	fmt.Printf("mixed: sent %.0f blocks/s; daemon processed %.0f stored blocks/s (%.0f/s new to the index); overflows %.0f, reader waits %.0f, seq gaps %.0f (missed batches %.0f); parity: %.0f matched, %.0f sampled out, %.0f mismatched\n",
		float64(sent.Load())/elapsed.Seconds(), processed/elapsed.Seconds(), d("kvindexd_blocks_stored_total")/elapsed.Seconds(),
		d("kvindexd_kvevents_queue_overflows_total"), d("kvindexd_kvevents_queue_waits_total"),
		d("kvindexd_kvevents_seq_gaps_total"), d("kvindexd_kvevents_missed_batches_total"),
		d("kvindexd_parity_matches_total"), d("kvindexd_parity_sampled_out_total"), d("kvindexd_parity_mismatches_total"))
	return scoreErr
}
