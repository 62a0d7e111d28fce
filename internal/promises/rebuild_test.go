package promises

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// rebuildEngine is a vLLM engine with a replay endpoint (enginepub's
// ReplayPublisher) whose replay answers the scenario can hold once armed:
// each held request's start is reported on requests and answered when
// release is closed.
type rebuildEngine struct {
	*enginepub.ReplayPublisher
	topic    string
	mu       sync.Mutex
	armed    bool
	requests chan uint64
	release  chan struct{}
}

func startRebuildEngine(t *testing.T, pod string, bufferSteps int) *rebuildEngine {
	t.Helper()
	e := &rebuildEngine{topic: "kv@" + pod + "@" + model, requests: make(chan uint64, 4), release: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	t.Cleanup(cancel)
	p, err := enginepub.NewReplayPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", e.topic, bufferSteps, func(start uint64) {
		e.mu.Lock()
		armed := e.armed
		e.mu.Unlock()
		if !armed {
			return // the daemon's catch-up at connect
		}
		e.requests <- start
		select {
		case <-e.release:
		case <-ctx.Done():
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.ReplayPublisher = p
	return e
}

func (e *rebuildEngine) arm() {
	e.mu.Lock()
	e.armed = true
	e.mu.Unlock()
}

func (e *rebuildEngine) publish(t *testing.T, b *event.Batch) {
	t.Helper()
	payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.PublishNext(payload); err != nil {
		t.Fatal(err)
	}
}

// fill publishes the engine's history: prompts 0..99 of 30 blocks each (one
// batch each: 3,000 blocks), then the removal of prompts 0..9 (ten
// batches): the engine holds 2,700 blocks, over seqs 0..109.
func (e *rebuildEngine) fill(t *testing.T) {
	t.Helper()
	for i := range 100 {
		toks := prompt(1000+i, 30)
		e.publish(t, stored(engineHashes(t, toks), toks))
	}
	for i := range 10 {
		e.publish(t, &event.Batch{Events: []event.Event{{Kind: event.BlockRemoved,
			BlockHashes: engineHashes(t, prompt(1000+i, 30))}}})
	}
}

// TestPromiseRedisLossRebuiltByReplay: a vLLM pod whose endpoint has a
// replay address (`--endpoint ...,replay=...`) is rebuilt from the engine's
// replay buffer when Redis loses its entries, although it is idle: incomplete
// ("index_lost") while the rebuild runs, then complete again, and exactly
// the engine's blocks once applied (apply_lag_seconds 0), a live batch
// published meanwhile applied after it.
// A buffer that no longer holds seq 0 cannot prove the pod whole: what it
// holds is rebuilt and the pod stays incomplete ("replay_window").
func TestPromiseRedisLossRebuiltByReplay(t *testing.T) {
	t.Parallel()
	t.Run("whole buffer", func(t *testing.T) {
		t.Parallel()
		redis := redistest.Start(t)
		e := startRebuildEngine(t, "pod-rebuilt", 10000)
		d := harness.Start(t, "--index", redis.URL(), "--endpoint", e.Addr()+",pod=pod-rebuilt,replay="+e.ReplayAddr())
		ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
		defer cancel()
		if err := e.WaitSubscribed(ctx, e.topic); err != nil {
			t.Fatal(err)
		}
		e.fill(t)
		kept, gone := prompt(1050, 30), prompt(1005, 30)
		// Complete says the daemon holds every batch, apply_lag_seconds 0
		// that the index has applied them; the block count alone proves
		// nothing: it passes through 2,700 after prompt 89 on its way to
		// 3,000, and through 2,730 after the rebuild's clear and prompt 90.
		wait.Until(t, "the pod indexed and complete", func() string {
			if p, ok := d.Pod("pod-rebuilt"); !ok || !p.Complete || p.ApplyLag != 0 || p.Blocks != 2700 || p.LastSeq != 109 {
				return fmt.Sprintf("pod %+v", p)
			}
			return ""
		})
		e.arm()
		redis.Restart()
		var start uint64
		select {
		case start = <-e.requests:
		case <-ctx.Done():
			t.Fatal("no rebuild asked the engine's replay buffer")
		}
		if start != 0 {
			t.Fatalf("the rebuild asked from seq %d, want 0", start)
		}
		if p, _ := d.Pod("pod-rebuilt"); p.Complete || p.Reason != "index_lost" {
			t.Fatalf("during the rebuild: %+v", p)
		}
		more := prompt(1200, 30) // live, while the rebuild holds the stream: seq 110
		e.publish(t, stored(engineHashes(t, more), more))
		close(e.release)
		wait.Until(t, "the pod rebuilt and complete", func() string {
			if p, ok := d.Pod("pod-rebuilt"); !ok || !p.Complete || p.ApplyLag != 0 || p.Blocks != 2730 || p.LastSeq != 110 {
				return fmt.Sprintf("pod %+v", p)
			}
			return ""
		})
		if s := d.ScoreTokens(model, kept)["pod-rebuilt"]; s != 30 {
			t.Errorf("a prompt the engine holds scores %d, want 30", s)
		}
		if s := d.ScoreTokens(model, more)["pod-rebuilt"]; s != 30 {
			t.Errorf("the live batch's prompt scores %d, want 30", s)
		}
		if s := d.ScoreTokens(model, gone); len(s) != 0 {
			t.Errorf("a prompt the engine removed is scored: %v", s)
		}
		if v := d.Metric(`kvindexd_index_lost_total{reason="restart"}`); v < 1 {
			t.Errorf(`kvindexd_index_lost_total{reason="restart"} = %v`, v)
		}
		if v := d.Metric(`kvindexd_kvevents_rebuilds_total{result="complete"}`); v != 1 {
			t.Errorf(`kvindexd_kvevents_rebuilds_total{result="complete"} = %v, want 1`, v)
		}
	})
	t.Run("wrapped buffer", func(t *testing.T) {
		t.Parallel()
		redis := redistest.Start(t)
		e := startRebuildEngine(t, "pod-wrapped", 50) // holds seqs 60..109 once filled
		d := harness.Start(t, "--index", redis.URL(), "--endpoint", e.Addr()+",pod=pod-wrapped,replay="+e.ReplayAddr())
		ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
		defer cancel()
		if err := e.WaitSubscribed(ctx, e.topic); err != nil {
			t.Fatal(err)
		}
		e.fill(t)
		wait.Until(t, "the pod indexed and complete", func() string {
			if p, ok := d.Pod("pod-wrapped"); !ok || !p.Complete || p.Blocks != 2700 {
				return fmt.Sprintf("pod %+v", p)
			}
			return ""
		})
		redis.Restart()
		// What the buffer held is indexed (prompts 60..99), the rest is not,
		// and the pod does not say complete.
		wait.Until(t, "the rebuild's outcome", func() string {
			if v := d.Metric(`kvindexd_kvevents_rebuilds_total{result="replay_window"}`); v != 1 {
				return fmt.Sprintf(`kvindexd_kvevents_rebuilds_total{result="replay_window"} = %v`, v)
			}
			if p, _ := d.Pod("pod-wrapped"); p.Blocks != 1200 || p.ApplyLag != 0 {
				return fmt.Sprintf("pod %+v", p)
			}
			return ""
		})
		if p, _ := d.Pod("pod-wrapped"); p.Complete || p.Reason != "replay_window" {
			t.Fatalf("after a rebuild from a wrapped buffer: %+v", p)
		}
		if s := d.ScoreTokens(model, prompt(1070, 30))["pod-wrapped"]; s != 30 {
			t.Errorf("a prompt of the buffer scores %d, want 30", s)
		}
		if s := d.ScoreTokens(model, prompt(1030, 30)); len(s) != 0 {
			t.Errorf("a prompt stored before the buffer's start is scored: %v", s)
		}
		if v := d.Metric(`kvindexd_kvevents_rebuilds_total{result="complete"}`); v != 0 {
			t.Errorf(`kvindexd_kvevents_rebuilds_total{result="complete"} = %v, want 0`, v)
		}
	})
}
