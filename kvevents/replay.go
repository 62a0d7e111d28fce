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

	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/zmtp"
)

// endSeq is the sequence number of the replay socket's end marker.
var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// replay fetches the batches [from, to) a gap skipped from the engine's
// replay socket and queues them, in order, ahead of the live batch that
// revealed the gap. st.order is held (that is what keeps the order); st.mu
// is taken only to publish statistics, so snapshots proceed meanwhile.
func (s *Subscriber) replay(ctx context.Context, st *stream, src *source, model string, from, to uint64) {
	var got uint64
	next := from
	err := fetchReplay(ctx, src.replay, from, s.cfg.ReplayTimeout, s.cfg.Transport, s.drop, func(seq uint64, payload []byte) {
		if seq < next || seq >= to {
			return // outside the gap, or a duplicate
		}
		b := &kvindex.Batch{Pod: st.key.pod, Model: model, Engine: src.engine, Seq: seq}
		ok, evErrs := s.decode(payload, b, src)
		if !ok || b.DPRank != st.key.rank {
			return
		}
		if evErrs > 0 {
			st.mu.Lock()
			st.stats.DecodeErrors += uint64(evErrs)
			st.mu.Unlock()
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
	st.mu.Lock()
	st.stats.ReplayedBatches += got
	st.stats.Replaying = false
	st.mu.Unlock()
	s.m.Replays.WithLabelValues(result).Inc()
	s.m.ReplayedBatches.Add(float64(got))
	lvl := slog.LevelInfo
	if result != "ok" {
		lvl = slog.LevelWarn
	}
	s.log.Log(ctx, lvl, "replay finished", "pod", st.key.pod, "dp_rank", st.key.rank, "from", from,
		"to", to, "recovered", got, "wanted", to-from, "result", result, "err", err)
}

// checkReplayAddr accepts the replay endpoints vLLM can bind: tcp:// and
// ipc://.
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
// deliver until the end marker. Replies are ["", seq8, payload] (vLLM <=
// 0.25) or ["", topic, seq8, payload] (>= 0.26); the end marker has seq
// 0xffffffffffffffff and an empty payload.
//
// The whole exchange, connecting and the ZMTP handshake included, ends
// within timeout, or earlier when ctx does; opts bound what the engine can
// make us buffer.
func fetchReplay(ctx context.Context, endpoint string, from uint64, timeout time.Duration, opts zmtp.Options,
	drop func(reason string), deliver func(seq uint64, payload []byte)) error {
	if err := checkReplayAddr(endpoint); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fail := func(what string, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr // the deadline or shutdown is the cause, not the i/o error it produced
		}
		return fmt.Errorf("replay %s: %s: %w", endpoint, what, err)
	}
	d, err := zmtp.DialDealer(ctx, endpoint, opts)
	if err != nil {
		return fail("connect", err)
	}
	defer d.Close()
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.Send(ctx, []byte{}, start[:]); err != nil {
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
		var seqB, payload []byte
		switch len(f) {
		case 2:
			seqB, payload = f[0], f[1]
		case 3:
			seqB, payload = f[1], f[2]
		default:
			drop("replay_frame_count")
			continue
		}
		if len(seqB) != 8 {
			drop("replay_seq_length")
			continue
		}
		if bytes.Equal(seqB, endSeq[:]) {
			return nil
		}
		deliver(binary.BigEndian.Uint64(seqB), payload)
	}
}
