package enginepub

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
	"github.com/vmihailenco/msgpack/v5"
)

// SGLangEngine is an SGLang publisher with a snapshot endpoint (snapshot-v1,
// as kvevents/snapshot.go reads it and hack/kvpublisher.py serves it to the
// interop tests): a bound PUB socket whose batches carry the topic
// "<topic>\x00sgl-kv-epoch=<epoch>" and are numbered 0, 1, 2, ..., a mirror
// of the blocks the published batches hold, and a ROUTER that answers
// ["", "snapshot-v1"] by publishing an empty barrier batch at the next seq
// (topic suffix "\x00sgl-kv-snapshot=<id>") and replying
//
//	["", "header", [1, epoch, dp_rank, barrier+1, barrier, id, records]]
//	["", "chunk", [[parent, [hash]], ...]]   (SnapshotChunk records each)
//	["", "end", ""]
//
// with the mirror as it stood at the barrier: publishing and answering hold
// one lock, as the engine publishes and snapshots on one thread. A test
// makes the engine hostile with SetFault.
type SGLangEngine struct {
	*Publisher
	router *zmtp.Router
	addr   string
	topic  string // with the epoch suffix
	epoch  string
	rank   int
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	next      uint64
	mirror    map[uint64]struct{}
	order     []uint64 // the mirror's hashes in the order stored (a snapshot lists them so)
	held      []uint64 // SetHeld's blocks, listed before the mirror's
	fault     SnapshotFault
	requests  int
	onRequest func(n int)
}

// SnapshotChunk is how many records one "chunk" reply carries.
const SnapshotChunk = 4096

// SnapshotFault makes the engine's snapshot replies hostile.
type SnapshotFault struct {
	// BarrierAhead is added to the header's barrier_seq (and resume_seq):
	// a barrier far past what the engine published.
	BarrierAhead uint64
	// Error, when not nil, is the whole reply: ["", "error", Error]; no
	// barrier batch is published.
	Error []byte
}

// NewSGLangEngine binds pubEndpoint and snapshotEndpoint ("tcp://host:0"
// picks free ports; Addr and SnapshotAddr report them) for a publisher of
// topic (kv@pod@model) in the lifetime epoch, on DP rank 0.
func NewSGLangEngine(pubEndpoint, snapshotEndpoint, topic, epoch string) (*SGLangEngine, error) {
	pub, err := NewPublisher(pubEndpoint, true)
	if err != nil {
		return nil, err
	}
	router, err := zmtp.ListenRouter(snapshotEndpoint, zmtp.Options{})
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("enginepub: snapshot %s: %w", snapshotEndpoint, err)
	}
	addr := snapshotEndpoint
	if strings.HasPrefix(snapshotEndpoint, "tcp://") {
		addr = dialable(snapshotEndpoint, router.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &SGLangEngine{Publisher: pub, router: router, addr: addr, topic: topic + "\x00sgl-kv-epoch=" + epoch, epoch: epoch,
		cancel: cancel, done: make(chan struct{}), mirror: map[uint64]struct{}{}}
	go e.serve(ctx)
	return e, nil
}

// SnapshotAddr is the snapshot endpoint to connect to.
func (e *SGLangEngine) SnapshotAddr() string { return e.addr }

// Topic is the topic the engine publishes on, epoch suffix included.
func (e *SGLangEngine) Topic() string { return e.topic }

// SetFault makes every later snapshot reply hostile as f says (the zero
// SnapshotFault: honest again).
func (e *SGLangEngine) SetFault(f SnapshotFault) {
	e.mu.Lock()
	e.fault = f
	e.mu.Unlock()
}

// OnRequest, when set, is called with the number of snapshot requests
// received so far, before each is answered (under no lock: it may block to
// hold the answer).
func (e *SGLangEngine) OnRequest(f func(n int)) {
	e.mu.Lock()
	e.onRequest = f
	e.mu.Unlock()
}

// Requests is how many snapshot requests the engine received.
func (e *SGLangEngine) Requests() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests
}

// PublishNext applies b to the mirror and publishes it as the next batch;
// it returns the batch's seq.
func (e *SGLangEngine) PublishNext(b *event.Batch) (uint64, error) {
	return e.next1(b, true)
}

// LoseNext applies b to the mirror and takes its seq without publishing
// it: a batch the subscriber never sees (a gap it cannot replay).
func (e *SGLangEngine) LoseNext(b *event.Batch) (uint64, error) {
	return e.next1(b, false)
}

func (e *SGLangEngine) next1(b *event.Batch, publish bool) (uint64, error) {
	payload, err := EncodeSGLangBatch(b)
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.applyMirror(b)
	seq := e.next
	e.next++
	if !publish {
		return seq, nil
	}
	return seq, e.Publish(e.topic, seq, payload)
}

// applyMirror keeps the mirror as SGLang's does: stored blocks are added,
// removed ones dropped, a clear empties it. e.mu is held.
func (e *SGLangEngine) applyMirror(b *event.Batch) {
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case event.BlockStored:
			for _, h := range ev.BlockHashes {
				if _, ok := e.mirror[h]; !ok {
					e.mirror[h] = struct{}{}
					e.order = append(e.order, h)
				}
			}
		case event.BlockRemoved:
			for _, h := range ev.BlockHashes {
				delete(e.mirror, h)
			}
		case event.AllBlocksCleared:
			clear(e.mirror)
			e.order, e.held = e.order[:0], nil
		}
	}
}

// SetHeld says the engine's cache also holds hs, without publishing them
// (a state of millions of blocks set at once, which a test does not publish
// block by block); its snapshots list them first. A clear drops them.
func (e *SGLangEngine) SetHeld(hs []uint64) {
	e.mu.Lock()
	e.held = hs
	e.mu.Unlock()
}

// records is the cache's blocks: SetHeld's, then the mirror's in the order
// they were stored. e.mu is held.
func (e *SGLangEngine) records() []uint64 {
	out := make([]uint64, 0, len(e.held)+len(e.mirror))
	out = append(out, e.held...)
	kept := e.order[:0]
	for _, h := range e.order {
		if _, ok := e.mirror[h]; ok {
			out = append(out, h)
			kept = append(kept, h)
		}
	}
	e.order = kept
	return out
}

// serve answers snapshot requests one at a time until Close.
func (e *SGLangEngine) serve(ctx context.Context) {
	defer close(e.done)
	for {
		msg, err := e.router.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		// [routing id, "", "snapshot-v1"]
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || string(msg.Frames[2]) != "snapshot-v1" {
			continue
		}
		id := msg.Frames[0]
		e.mu.Lock()
		e.requests++
		n, hook := e.requests, e.onRequest
		e.mu.Unlock()
		if hook != nil {
			hook(n)
		}
		e.answer(ctx, id)
	}
}

// answer cuts the snapshot (the barrier batch published and the records
// taken under the lock, as of the barrier) and sends it, a chunk encoded at
// a time.
func (e *SGLangEngine) answer(ctx context.Context, id []byte) {
	send := func(kind string, body []byte) bool { return e.router.Send(ctx, id, nil, []byte(kind), body) == nil }
	e.mu.Lock()
	if e.fault.Error != nil {
		text := e.fault.Error
		e.mu.Unlock()
		send("error", text)
		return
	}
	barrier := e.next
	e.next++
	bid := fmt.Sprintf("cut-%d", barrier)
	empty, err := msgpack.Marshal([]any{0.0, []any{}, e.rank})
	if err == nil {
		err = e.Publish(e.topic+"\x00sgl-kv-snapshot="+bid, barrier, empty)
	}
	recs := e.records()
	cut := barrier + e.fault.BarrierAhead
	e.mu.Unlock()
	if err != nil {
		send("error", []byte(err.Error()))
		return
	}
	header, _ := msgpack.Marshal([]any{1, e.epoch, e.rank, int64(cut + 1), int64(cut), bid, len(recs)})
	if !send("header", header) {
		return
	}
	for len(recs) > 0 {
		n := min(len(recs), SnapshotChunk)
		if !send("chunk", encodeChunk(recs[:n])) {
			return
		}
		recs = recs[n:]
	}
	send("end", nil)
}

// encodeChunk is a chunk's records [[parent, [hash]], ...], hashes signed
// as SGLang sends them; every record names no parent (the records are a set
// to the subscriber).
func encodeChunk(hs []uint64) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	_ = enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeNil()
		_ = enc.EncodeArrayLen(1)
		_ = enc.EncodeInt(int64(h))
	}
	return buf.Bytes()
}

// Close closes both sockets.
func (e *SGLangEngine) Close() {
	e.cancel()
	e.router.Close()
	<-e.done
	e.Publisher.Close()
}
