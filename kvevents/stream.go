package kvevents

import (
	"context"
	"sort"
	"sync"

	"github.com/kvindex/kvindex/kvindex"
)

// StreamStats describes one (pod, data-parallel rank) stream.
type StreamStats struct {
	Pod             string
	DPRank          int
	Model           string
	Endpoint        string // the endpoint (or bind address) it arrives on
	Engine          kvindex.Engine
	LastSeq         uint64
	Batches         uint64 // live batches accepted
	SeqGaps         uint64 // forward jumps
	MissedBatches   uint64 // batches skipped by those jumps
	ReplayedBatches uint64 // of which recovered by replay
	Replaying       bool   // a replay exchange for a gap is in progress
	Restarts        uint64 // backward jumps (engine restarts)
	DecodeErrors    uint64 // malformed events dropped
	Overflows       uint64 // batches dropped on a full queue
}

type streamKey struct {
	pod  string
	rank int
}

// stream is one (pod, dp rank): its sequence state and its statistics,
// under two locks so that a snapshot never waits on the network.
type stream struct {
	key    streamKey
	worker int // fixed for life: that is what keeps its batches in order

	// order serializes a batch's way from the sequence check to its queue.
	// The reader holds it across a replay exchange (bounded by
	// ReplayTimeout), which keeps the replayed batches ahead of the live
	// one even if another socket delivers the same stream meanwhile. Only
	// readers and the replay take it.
	order     sync.Mutex
	hasSeq    bool
	lastSeq   uint64
	needClear bool
	clearWhy  string

	// mu guards stats. It is held only to copy or bump them, never across
	// I/O or a channel operation: Streams takes nothing else.
	mu    sync.Mutex
	stats StreamStats
}

func (st *stream) snapshot() StreamStats {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.stats
}

// Streams lists every (pod, dp rank) stream seen, sorted by pod then rank.
// It never waits on a socket or a replay in progress.
func (s *Subscriber) Streams() []StreamStats {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	out := make([]StreamStats, 0, len(all))
	for _, st := range all {
		out = append(out, st.snapshot())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pod != out[j].Pod {
			return out[i].Pod < out[j].Pod
		}
		return out[i].DPRank < out[j].DPRank
	})
	return out
}

// stream returns k's stream, creating it on first sight.
func (s *Subscriber) stream(k streamKey) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[k]
	if st == nil {
		st = &stream{key: k, worker: s.work.workerFor(k)}
		st.stats.Pod, st.stats.DPRank = k.pod, k.rank
		s.streams[k] = st
	}
	return st
}

// sequence checks b's seq against the stream, repairs or flags what it finds
// and queues b. evErrs is the number of b's events the decoder dropped.
func (s *Subscriber) sequence(ctx context.Context, st *stream, src *source, b *kvindex.Batch, evErrs int) {
	st.order.Lock()
	defer st.order.Unlock()
	var missed uint64
	restart := false
	last := st.lastSeq
	if st.hasSeq {
		switch {
		case b.Seq == last+1:
		case b.Seq > last+1:
			missed = b.Seq - last - 1
		default:
			restart = true
		}
	}
	replay := missed > 0 && src.replay != ""

	st.mu.Lock()
	// The endpoint a stream's latest batch came through is the one whose
	// removal clears it (RemoveEndpoint).
	st.stats.Endpoint, st.stats.Engine, st.stats.Model = src.addr, src.engine, b.Model
	st.stats.DecodeErrors += uint64(evErrs)
	if missed > 0 {
		st.stats.SeqGaps++
		st.stats.MissedBatches += missed
		st.stats.Replaying = replay
	}
	if restart {
		st.stats.Restarts++
	}
	st.mu.Unlock()

	switch {
	case missed > 0:
		s.m.SeqGaps.Inc()
		s.m.MissedBatches.Add(float64(missed))
		s.log.Warn("KV event sequence gap: batches lost", "pod", b.Pod, "dp_rank", b.DPRank,
			"last_seq", last, "seq", b.Seq, "missed", missed, "replay", replay)
		if replay {
			s.replay(ctx, st, src, b.Model, last+1, b.Seq)
			if ctx.Err() != nil {
				// The endpoint is being removed (its clear follows) or the
				// subscriber is stopping: the live batch goes with the replay.
				return
			}
		}
	case restart:
		s.m.Restarts.Inc()
		s.log.Warn("engine restart detected (sequence went backwards): clearing pod", "pod", b.Pod,
			"dp_rank", b.DPRank, "last_seq", last, "seq", b.Seq)
		st.needClear, st.clearWhy = true, "restart"
	}
	st.hasSeq, st.lastSeq = true, b.Seq
	st.mu.Lock()
	st.stats.LastSeq = b.Seq
	st.stats.Batches++
	st.mu.Unlock()
	s.enqueue(st, b)
}

// enqueue hands b to its worker, waiting a bounded time on a full queue
// (backpressure.go). If the queue stays full the batch is dropped and the
// stream marked: a synthetic AllBlocksCleared goes in front of its next
// queued batch, because the sink has now missed events and its state for
// the pod is no longer complete.
// st.order is held.
func (s *Subscriber) enqueue(st *stream, b *kvindex.Batch) {
	if st.needClear {
		ev := make([]kvindex.Event, 0, len(b.Events)+1)
		ev = append(ev, kvindex.Event{Kind: kvindex.AllBlocksCleared})
		b.Events = append(ev, b.Events...)
	}
	if s.work.queueBounded(st.worker, b) {
		if st.needClear {
			s.m.SyntheticClears.WithLabelValues(st.clearWhy).Inc()
			st.needClear = false
		}
		return
	}
	st.mu.Lock()
	st.stats.Overflows++
	st.mu.Unlock()
	s.m.QueueOverflows.Inc()
	if !st.needClear || st.clearWhy != "overflow" {
		s.log.Warn("worker queue full: dropping batch; pod will be cleared before its next batch",
			"pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq)
	}
	st.needClear, st.clearWhy = true, "overflow"
}
