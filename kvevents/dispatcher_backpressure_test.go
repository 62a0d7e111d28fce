package kvevents

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// A reader that meets a full queue waits for the worker instead of dropping
// the batch and clearing the pod: no overflow, nothing cleared, order kept.
func TestFullQueueBackpressureInsteadOfOverflow(t *testing.T) {
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{Workers: 1, QueueSize: 1, QueueWait: time.Minute}, newCollectSink(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &source{addr: "test", msgs: m.MessagesReceived.WithLabelValues("connect")}
	msg := func(seq uint64, h uint64) [][]byte {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], seq)
		return [][]byte{[]byte("kv@pod-b@m"), s8[:], payload(t, storedBatch(h))}
	}
	ctx := context.Background()
	s.handle(ctx, src, msg(0, 10)) // fills the queue
	done := make(chan struct{})
	go func() {
		s.handle(ctx, src, msg(1, 11)) // must wait for room
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("reader did not wait on a full queue")
	case <-time.After(50 * time.Millisecond):
	}
	q := s.dispatcher.queues[0]
	for want := uint64(0); want < 2; want++ { // stand in for the worker
		if b := standIn(next(t, q)); b.Seq != want || len(b.Events) != 1 {
			t.Fatalf("batch %d: got seq %d with %d events", want, b.Seq, len(b.Events))
		}
	}
	<-done
	if o, w := metricValue(m.QueueOverflows), metricValue(m.QueueWaits); o != 0 || w != 1 {
		t.Fatalf("overflows %v waits %v", o, w)
	}
	if st := s.Streams()[0]; st.Overflows != 0 {
		t.Fatalf("stream %+v", st)
	}
}

// next is the worker's next item, waiting for it (up to testTimeout).
func next(t *testing.T, q *workQueue) queued {
	t.Helper()
	stop := make(chan struct{})
	defer time.AfterFunc(testTimeout, func() { close(stop) }).Stop()
	it, ok := q.take(stop)
	if !ok {
		t.Fatal("nothing queued")
	}
	return it
}

// standIn does what the worker does with a queued item besides applying it:
// the stream's share gets its room back.
func standIn(it queued) *event.Batch {
	if it.owner != nil {
		it.owner.applied(batchBytes(it.batch))
	}
	return it.batch
}

// QueueWait < 0 restores drop-at-once: no wait is counted.
func TestNegativeQueueWaitDropsAtOnce(t *testing.T) {
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{Workers: 1, QueueSize: 1, QueueWait: -1}, newCollectSink(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := &source{addr: "test", msgs: m.MessagesReceived.WithLabelValues("connect")}
	for seq := uint64(0); seq < 2; seq++ {
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], seq)
		s.handle(context.Background(), src, [][]byte{[]byte("kv@pod-n@m"), s8[:], payload(t, storedBatch(seq))})
	}
	if o, w := metricValue(m.QueueOverflows), metricValue(m.QueueWaits); o != 1 || w != 0 {
		t.Fatalf("overflows %v waits %v", o, w)
	}
}
