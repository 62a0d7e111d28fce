package enginepub

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// ReplayPublisher is a vLLM-style engine publisher with a replay endpoint
// (vllm/distributed/kv_events.py, ZmqEventPublisher): a bound PUB socket
// whose batches are numbered 0, 1, 2, ... and kept in a buffer of the last
// bufferSteps, and a ROUTER that answers a request [start seq (8 bytes, big
// endian)] with every buffered batch of seq >= start, [topic, seq, payload]
// (vLLM >= 0.26), then the end marker ["", 0xff x 8, ""]. vLLM publishes
// and answers on one thread, so an answer holds everything published before
// it; here an answer is cut under the publishing lock the same way.
type ReplayPublisher struct {
	*Publisher
	router     *zmtp.Router
	replayAddr string
	topic      []byte
	onReplay   func(start uint64)
	cancel     context.CancelFunc
	done       chan struct{}

	mu    sync.Mutex
	next  uint64     // the next batch's seq
	buf   []buffered // ring of the last len(buf) batches, oldest at head
	head  int
	count int
}

type buffered struct {
	seq     uint64
	payload []byte
}

// NewReplayPublisher binds pubEndpoint and replayEndpoint ("tcp://host:0"
// picks free ports; Addr and ReplayAddr report them). Batches go out on
// topic; the replay buffer keeps the last bufferSteps (vLLM's buffer_steps,
// at least 1). onReplay, when not nil, is called with each request's start
// before it is answered, and may block: a test holds the engine's answer
// with it, while publishing goes on.
func NewReplayPublisher(pubEndpoint, replayEndpoint, topic string, bufferSteps int, onReplay func(start uint64)) (*ReplayPublisher, error) {
	if bufferSteps < 1 {
		return nil, fmt.Errorf("enginepub: buffer steps %d, want at least 1", bufferSteps)
	}
	pub, err := NewPublisher(pubEndpoint, true)
	if err != nil {
		return nil, err
	}
	router, err := zmtp.ListenRouter(replayEndpoint, zmtp.Options{})
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("enginepub: replay %s: %w", replayEndpoint, err)
	}
	addr := replayEndpoint
	if strings.HasPrefix(replayEndpoint, "tcp://") {
		addr = dialable(replayEndpoint, router.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &ReplayPublisher{Publisher: pub, router: router, replayAddr: addr, topic: []byte(topic), onReplay: onReplay,
		cancel: cancel, done: make(chan struct{}), buf: make([]buffered, bufferSteps)}
	go p.serve(ctx)
	return p, nil
}

// ReplayAddr is the replay endpoint to connect to.
func (p *ReplayPublisher) ReplayAddr() string { return p.replayAddr }

// PublishNext publishes payload as the next batch and keeps it for replay;
// it returns the batch's seq.
func (p *ReplayPublisher) PublishNext(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.next
	// Buffered before it is sent, as a batch vLLM sent is buffered before
	// the next request is answered: the lock covers both here.
	p.buf[(p.head+p.count)%len(p.buf)] = buffered{seq: seq, payload: payload}
	if p.count < len(p.buf) {
		p.count++
	} else {
		p.head = (p.head + 1) % len(p.buf)
	}
	p.next++
	if err := p.Publish(string(p.topic), seq, payload); err != nil {
		return seq, err
	}
	return seq, nil
}

// serve answers replay requests one at a time until Close.
func (p *ReplayPublisher) serve(ctx context.Context) {
	defer close(p.done)
	for {
		msg, err := p.router.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		// [routing id, "", start seq]
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		if p.onReplay != nil {
			p.onReplay(start)
		}
		p.mu.Lock()
		var answer []buffered
		for i := 0; i < p.count; i++ {
			if b := p.buf[(p.head+i)%len(p.buf)]; b.seq >= start {
				answer = append(answer, b)
			}
		}
		p.mu.Unlock()
		for _, b := range answer {
			var s8 [8]byte
			binary.BigEndian.PutUint64(s8[:], b.seq)
			if p.router.Send(ctx, id, nil, p.topic, s8[:], b.payload) != nil {
				break
			}
		}
		end := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_ = p.router.Send(ctx, id, nil, nil, end[:], nil)
	}
}

// Close closes both sockets.
func (p *ReplayPublisher) Close() {
	p.cancel()
	p.router.Close()
	<-p.done
	p.Publisher.Close()
}
