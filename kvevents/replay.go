package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// endSeq is the sequence number of the replay socket's end marker.
var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replay fetches the batches [from, to) a gap skipped from the engine's
// replay socket and queues them, in order, ahead of the live batch that
// revealed the gap. st.order is held (that is what keeps the order); st.mu
// is taken only to publish statistics, so snapshots proceed meanwhile.
//
// filled reports that every batch up to to-1 was queued, in one unbroken run
// starting at run; run > from means the engine's buffer no longer holds the
// start of the gap.
func (s *Subscriber) replay(ctx context.Context, st *stream, src *source, model string, from, to uint64) (run uint64, filled bool) {
	var got uint64
	next := from
	run = from
	err := fetchReplay(ctx, src.replay, from, s.cfg.ReplayTimeout, s.cfg.Transport, s.drop, func(_ []byte, seq uint64, payload []byte) {
		if seq < next || seq >= to {
			return // outside the gap, or a duplicate
		}
		b := &event.Batch{Pod: st.key.pod, Model: model, Engine: src.engine, Seq: seq}
		ok, evErrs := s.decode(payload, b, src)
		if !ok || b.DPRank != st.key.rank {
			return
		}
		if evErrs > 0 {
			st.mu.Lock()
			st.stats.DecodeErrors += uint64(evErrs)
			st.mu.Unlock()
		}
		if seq != next {
			run = seq
		}
		next = seq + 1
		got++
		s.enqueue(st, b)
	})
	result := "ok"
	switch {
	case err != nil && got > 0:
		result = "partial"
	case err != nil:
		result = "error"
	case got < to-from:
		result, err = "partial", errors.New("engine no longer buffers every missed batch")
	}
	filled = next == to && (err == nil || result == "partial")
	st.mu.Lock()
	st.stats.ReplayedBatches += got
	st.stats.Replaying = false
	st.mu.Unlock()
	s.metrics.Replays.WithLabelValues(result).Inc()
	s.metrics.ReplayedBatches.Add(float64(got))
	lvl := slog.LevelInfo
	if result != "ok" {
		lvl = slog.LevelWarn
	}
	s.log.Log(ctx, lvl, "replay finished", "pod", st.key.pod, "dp_rank", st.key.rank, "from", from,
		"to", to, "recovered", got, "wanted", to-from, "result", result, "err", err)
	return run, filled
}

// catchUp asks a freshly (re)connected endpoint's replay socket for every
// batch it buffered after the last one we hold from that endpoint (all of
// them the first time), so a daemon that starts or reconnects after the
// engine published serves the engine at once instead of waiting for its next
// event. Batches go through sequence like live ones, in order; it runs before
// the endpoint's live socket is read, and live copies of what it delivered
// are dropped (stream.dedup). Replies without a topic (vLLM <= 0.25, every
// SGLang) need the endpoint's Pod, and its Model or a model the stream
// already had (from live batches before a reconnect); otherwise they are
// left out (unattributed) and the first live batch, whose topic names both,
// repairs the start through replay or a snapshot. A loss catch-up finds
// asks the snapshot endpoint at once (decideSeq).
func (s *Subscriber) catchUp(ctx context.Context, src *source) {
	from, known := s.resumeSeq(src)
	var got, skipped int
	targets := src.targets() // a shared address: one exchange, every sharer served
	err := fetchReplay(ctx, src.replay, from, s.cfg.ReplayTimeout, s.cfg.Transport, s.drop, func(topic []byte, seq uint64, payload []byte) {
		for _, v := range targets {
			v.handling.Lock()
			if !v.removed {
				vctx := ctx
				if v.conn != nil {
					vctx = v.ctx
				}
				switch s.catchUpBatch(vctx, v, topic, seq, payload) {
				case caughtUp:
					got++
				case unattributed:
					skipped++
				}
			}
			v.handling.Unlock()
		}
	})
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.metrics.CatchUps.WithLabelValues(result).Inc()
	s.metrics.CaughtUpBatches.Add(float64(got))
	s.log.Info("caught up from the engine's replay buffer", "endpoint", src.addr, "from", from, "known", known,
		"batches", got, "unattributed", skipped, "err", err)
}

// catchUpOutcome is what became of one catch-up reply for one source.
type catchUpOutcome int

const (
	caughtUp catchUpOutcome = iota
	unattributed
	notSequenced // dropped (counted where dropped) or already held
)

// catchUpBatch delivers one catch-up reply to src.
func (s *Subscriber) catchUpBatch(ctx context.Context, src *source, topic []byte, seq uint64, payload []byte) catchUpOutcome {
	pod, model := src.pod, src.model
	var epoch []byte
	if topic != nil {
		if !s.topicAllowed(src, topic) {
			s.drop("topic_filter")
			return notSequenced
		}
		podB, modelB := parseTopic(topic)
		_, epoch, _ = splitTopicMeta(topic)
		if pod == "" {
			pod = string(podB)
		}
		if model == "" {
			model = string(modelB)
		}
	}
	if pod == "" {
		return unattributed
	}
	b := &event.Batch{Pod: pod, Model: model, Engine: src.engine, Seq: seq}
	ok, evErrs := s.decode(payload, b, src)
	if !ok || checkName([]byte(pod), MaxPodNameBytes) != "" || checkName([]byte(model), MaxModelNameBytes) != "" {
		s.drop("catch_up_rejected")
		return notSequenced
	}
	if topic == nil && src.model == "" {
		known, ok := s.streamModel(streamKey{pod, b.DPRank})
		if !ok {
			// Indexing it under no model would split the pod
			// between two models once live batches name it.
			return unattributed
		}
		b.Model = known
	}
	if st := s.admitBatch(src, b); st != nil && s.sequence(ctx, st, src, b, evErrs, epoch, fromCatchUp) {
		return caughtUp
	}
	return notSequenced
}

// streamModel is the model of the stream's last batch, if it had one.
func (s *Subscriber) streamModel(k streamKey) (string, bool) {
	s.mu.Lock()
	st := s.streams[k]
	s.mu.Unlock()
	if st == nil {
		return "", false
	}
	ss := st.currentStats()
	return ss.Model, ss.Batches > 0
}

// resumeSeq is where catch-up starts for src: after the lowest last seq of
// the streams that arrived through it, or 0 if none did.
func (s *Subscriber) resumeSeq(src *source) (from uint64, known bool) {
	s.mu.Lock()
	all := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		all = append(all, st)
	}
	s.mu.Unlock()
	for _, st := range all {
		ss := st.currentStats()
		if ss.Endpoint != src.addr {
			continue
		}
		if !known || ss.LastSeq+1 < from {
			from = ss.LastSeq + 1
		}
		known = true
	}
	return from, known
}

// checkReplayAddr accepts what the replay and snapshot exchanges can dial.
func checkReplayAddr(endpoint string) error {
	switch {
	case strings.HasPrefix(endpoint, "tcp://") && len(endpoint) > len("tcp://"),
		strings.HasPrefix(endpoint, "ipc://") && len(endpoint) > len("ipc://"):
		return nil
	}
	return fmt.Errorf("replay endpoint %q: want tcp://host:port or ipc://path", endpoint)
}

// fetchReplay is one exchange with an engine's replay socket (a ROUTER): it
// asks for every buffered batch from seq from on and hands each reply to
// deliver until the end marker (topic is nil in the older layout). Replies
// are ["", seq8, payload] (vLLM <= 0.25) or ["", topic, seq8, payload]
// (>= 0.26); the end marker has seq 0xffffffffffffffff and an empty payload.
func fetchReplay(ctx context.Context, endpoint string, from uint64, timeout time.Duration, opts zmtp.Options,
	drop func(reason string), deliver func(topic []byte, seq uint64, payload []byte)) error {
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	err := dealerExchange(ctx, endpoint, timeout, opts, start[:], func(f [][]byte) (bool, error) {
		var topic, seqB, payload []byte
		switch len(f) {
		case 2:
			seqB, payload = f[0], f[1]
		case 3:
			topic, seqB, payload = f[0], f[1], f[2]
		default:
			drop("replay_frame_count")
			return false, nil
		}
		if len(seqB) != 8 {
			drop("replay_seq_length")
			return false, nil
		}
		if bytes.Equal(seqB, endSeq[:]) {
			return true, nil
		}
		deliver(topic, binary.BigEndian.Uint64(seqB), payload)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("replay %w", err)
	}
	return nil
}

// dealerExchange sends request (after the empty delimiter) to an engine's
// ROUTER socket and hands each reply's frames, delimiter removed, to handle
// until it reports done or fails.
//
// The whole exchange, connecting and the ZMTP handshake included, ends
// within timeout, or earlier when ctx does; opts bound what the engine can
// make us buffer.
func dealerExchange(ctx context.Context, endpoint string, timeout time.Duration, opts zmtp.Options, request []byte,
	handle func(frames [][]byte) (done bool, err error)) error {
	if err := checkReplayAddr(endpoint); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fail := func(what string, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr // the deadline or shutdown is the cause, not the i/o error it produced
		}
		return fmt.Errorf("%s: %s: %w", endpoint, what, err)
	}
	d, err := zmtp.DialDealer(ctx, endpoint, opts)
	if err != nil {
		return fail("connect", err)
	}
	defer d.Close()
	if err := d.Send(ctx, []byte{}, request); err != nil {
		return fail("request", err)
	}
	for {
		msg, err := d.Recv(ctx)
		if err != nil {
			return fail("receive", err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		done, err := handle(f)
		if err != nil {
			return fail("reply", err)
		}
		if done {
			return nil
		}
	}
}
