package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// SGLang's snapshot protocol (snapshot-v1). A publisher started with a
// snapshot_endpoint keeps a mirror of its cache's blocks. A DEALER sends
// ["", "snapshot-v1"]; the publisher publishes an empty barrier batch (topic
// suffix "\x00sgl-kv-snapshot=<id>") at barrier_seq and answers
//
//	["", "header", [version, epoch, replica_rank, resume_seq, barrier_seq, barrier_id, record_count]]
//	["", "chunk", [[parent_block_hash, [block_hash, ...]], ...]]   (repeated)
//	["", "end", ""]        or ["", "error", message]
//
// The records are the cache's state after every batch before resume_seq
// (= barrier_seq + 1): for the index, a snapshot replaces the pod's state
// at that point (event.BlockSnapshot) and live batches apply from
// resume_seq on.

// DefaultMaxSnapshotRecords bounds one snapshot's records (8 bytes each in
// memory while it is applied).
const DefaultMaxSnapshotRecords = 1 << 22

var snapshotRequest = []byte("snapshot-v1")

// maxSnapshotLead bounds how far past the batch that asked for it a
// snapshot's barrier may be: the batches the engine publishes during one
// exchange (ReplayTimeout), far fewer than 2^16 at any engine's rate.
const maxSnapshotLead = 1 << 16

// maxPeerText bounds the text of an engine's (or any peer's) reply that goes
// into an error or a log line: a 32 MiB "error" reply must not become a
// 32 MiB log line.
const maxPeerText = 256

// peerText is b quoted for a log line, cut to maxPeerText bytes with the
// length it had.
func peerText(b []byte) string {
	if len(b) <= maxPeerText {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(string(b[:maxPeerText])), len(b))
}

type snapshotHeader struct {
	epoch       string
	replicaRank int64
	resumeSeq   uint64
	barrierSeq  uint64
	records     uint64
}

// fetchSnapshot runs one snapshot exchange and returns its header and the
// block hashes it lists (SGLang's, normalised like event hashes).
func fetchSnapshot(ctx context.Context, endpoint string, timeout time.Duration, opts zmtp.Options, maxRecords int) (snapshotHeader, []uint64, error) {
	var h snapshotHeader
	var hashes []uint64
	sawHeader := false
	err := dealerExchange(ctx, endpoint, timeout, opts, snapshotRequest, func(f [][]byte) (bool, error) {
		if len(f) != 2 {
			return false, fmt.Errorf("reply of %d frames", len(f))
		}
		switch kind, body := string(f[0]), f[1]; kind {
		case "header":
			var err error
			h, err = decodeSnapshotHeader(body)
			if err != nil {
				return false, err
			}
			if h.records > uint64(maxRecords) {
				return false, fmt.Errorf("snapshot of %d records exceeds the limit of %d", h.records, maxRecords)
			}
			sawHeader = true
			hashes = make([]uint64, 0, h.records)
		case "chunk":
			if !sawHeader {
				return false, errors.New("chunk before header")
			}
			var err error
			if hashes, err = decodeSnapshotChunk(body, hashes, maxRecords); err != nil {
				return false, err
			}
		case "end":
			if !sawHeader {
				return false, errors.New("end before header")
			}
			return true, nil
		case "error":
			return false, fmt.Errorf("engine: %s", peerText(body))
		default:
			return false, fmt.Errorf("unknown reply %s", peerText(f[0]))
		}
		return false, nil
	})
	if err != nil {
		return h, nil, fmt.Errorf("snapshot %w", err)
	}
	return h, hashes, nil
}

func decodeSnapshotHeader(b []byte) (snapshotHeader, error) {
	var h snapshotHeader
	r := reader{b: b}
	n, err := r.arrayLen()
	if err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if n < 7 {
		return h, fmt.Errorf("header of %d fields, want 7", n)
	}
	version, err := r.int64v()
	if err == nil && version != 1 {
		err = fmt.Errorf("version %d, want 1", version)
	}
	var epoch []byte
	if err == nil {
		epoch, err = r.strOrBin()
	}
	if err == nil {
		h.replicaRank, err = r.int64v()
	}
	var v [2]int64
	for i := 0; i < 2 && err == nil; i++ {
		if v[i], err = r.int64v(); err == nil && v[i] < 0 {
			err = errors.New("negative sequence number")
		}
	}
	if err == nil {
		err = r.skip() // barrier_id: the topic carries it too
	}
	var records int64
	if err == nil {
		if records, err = r.int64v(); err == nil && records < 0 {
			err = errors.New("negative record count")
		}
	}
	if err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	h.epoch, h.resumeSeq, h.barrierSeq, h.records = string(epoch), uint64(v[0]), uint64(v[1]), uint64(records)
	if h.resumeSeq != h.barrierSeq+1 {
		return h, fmt.Errorf("header: resume_seq %d is not barrier_seq %d + 1", h.resumeSeq, h.barrierSeq)
	}
	return h, nil
}

// decodeSnapshotChunk appends the hashes of one chunk's records
// [parent_block_hash, [block_hash, ...]] to out.
func decodeSnapshotChunk(b []byte, out []uint64, maxRecords int) ([]uint64, error) {
	r := reader{b: b}
	n, err := r.arrayLen()
	if err != nil {
		return out, fmt.Errorf("chunk: %w", err)
	}
	for i := 0; i < n; i++ {
		m, err := r.arrayLen()
		if err != nil || m < 2 {
			return out, fmt.Errorf("chunk record %d: want [parent, hashes]", i)
		}
		if err := r.skip(); err != nil { // the parent: the records are a set
			return out, err
		}
		hs, err := decodeHashes(&r, blockkeys.EngineSGLang)
		if err != nil {
			return out, fmt.Errorf("chunk record %d: %w", i, err)
		}
		if len(out)+len(hs) > maxRecords {
			return out, fmt.Errorf("snapshot exceeds %d records", maxRecords)
		}
		out = append(out, hs...)
		for j := 2; j < m; j++ {
			if err := r.skip(); err != nil {
				return out, err
			}
		}
	}
	if r.remaining() != 0 {
		return out, fmt.Errorf("chunk: %d trailing bytes", r.remaining())
	}
	return out, nil
}

// resync replaces the stream's state with a snapshot from src's snapshot
// endpoint after it became incomplete (batches lost beyond repair), and
// moves the stream to the snapshot's resume point: live batches before it
// are dropped as already included. st.order is held. It reports whether the
// stream is complete again.
func (s *Subscriber) resync(ctx context.Context, st *stream, src *source, model string) bool {
	h, hashes, err := fetchSnapshot(ctx, src.snapshot, s.cfg.ReplayTimeout, s.cfg.Transport, s.cfg.MaxSnapshotRecords)
	result := "ok"
	switch {
	case err != nil:
		result = "error"
	case st.epoch != "" && h.epoch != st.epoch:
		result, err = "stale", fmt.Errorf("snapshot epoch %s, stream epoch %s", peerText([]byte(h.epoch)), peerText([]byte(st.epoch)))
	case h.replicaRank != int64(st.key.rank):
		result, err = "stale", fmt.Errorf("snapshot of replica %d for DP rank %d", h.replicaRank, st.key.rank)
	case h.barrierSeq < st.lastSeq:
		result, err = "stale", fmt.Errorf("snapshot cut at seq %d, before the last batch held (%d)", h.barrierSeq, st.lastSeq)
	case h.barrierSeq-st.lastSeq > maxSnapshotLead:
		// The barrier is the next seq the engine assigns after the batch
		// that asked: a few more at most, for batches published during
		// the exchange. One far ahead would make every live batch up to it
		// read as already included and be dropped while the pod says
		// complete.
		result, err = "stale", fmt.Errorf("snapshot cut at seq %d, more than %d past the last batch held (%d)", h.barrierSeq, maxSnapshotLead, st.lastSeq)
	}
	s.metrics.Snapshots.WithLabelValues(result).Inc()
	if err != nil {
		// Through the limiter, keyed by the endpoint: an engine that fails
		// every snapshot (or answers each with a huge error) writes a few
		// bounded lines, not one per attempt.
		s.warn(src.snapshot+"|snapshot", "engine snapshot not applied; pod stays incomplete", "pod", st.key.pod, "dp_rank", st.key.rank,
			"endpoint", src.snapshot, "err", err)
		return false
	}
	b := &event.Batch{Pod: st.key.pod, DPRank: st.key.rank, Model: model, Engine: src.engine, Seq: h.barrierSeq,
		Events: []event.Event{{Kind: event.BlockSnapshot, BlockHashes: hashes}}}
	if !st.dedup {
		st.dedup, st.dedupFrom = true, st.lastSeq+1
	}
	st.lastSeq = h.barrierSeq
	if st.epoch == "" {
		// SGLang's replay replies carry no topic: a stream that joined
		// through them learns its lifetime here, so a later live batch of
		// another epoch is seen as the restart it is.
		st.epoch = h.epoch
	}
	st.mu.Lock()
	st.stats.LastSeq = h.barrierSeq
	st.stats.Epoch = st.epoch
	st.mu.Unlock()
	st.setComplete(h.barrierSeq, "")
	s.enqueue(st, b)
	s.log.Info("pod state replaced by an engine snapshot", "pod", st.key.pod, "dp_rank", st.key.rank,
		"resume_seq", h.resumeSeq, "blocks", len(hashes))
	return true
}
