package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/kvevents/event"
)

// turnSink records each Apply: the pod, the seq, and for a snapshot event
// its records and whether it is a part. failAt, when > 0, makes that apply
// (counted from 1) report an index failure.
type turnSink struct {
	mu     sync.Mutex
	log    []turnRec
	failAt int
	done   chan struct{} // closed when doneAfter applies happened
	doneN  int
}

type turnRec struct {
	pod     string
	seq     uint64
	kinds   []event.Kind
	records []uint64
	part    bool
}

func (s *turnSink) Apply(_ context.Context, b *event.Batch) event.ApplyOutcome {
	r := turnRec{pod: b.Pod, seq: b.Seq}
	for _, ev := range b.Events {
		r.kinds = append(r.kinds, ev.Kind)
		if ev.Kind == event.BlockSnapshot {
			r.records = append(r.records, ev.BlockHashes...)
			r.part = ev.SnapshotPart
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, r)
	if len(s.log) == s.doneN {
		close(s.done)
	}
	return event.ApplyOutcome{IndexFailed: len(s.log) == s.failAt}
}

func (s *turnSink) ForgetPod(context.Context, string, int) {}

// snapshotBatch is pod's snapshot of n records, 1..n, with a synthetic
// clear in front (as enqueue puts one).
func snapshotBatch(pod string, seq uint64, n int) *event.Batch {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	return &event.Batch{Pod: pod, Seq: seq, Events: []event.Event{{Kind: event.AllBlocksCleared}, {Kind: event.BlockSnapshot, BlockHashes: hs}}}
}

// Issue 35: a snapshot was applied as one unit on its pod's worker, so an
// honest pod's batch on that worker waited for all of it (an update 42.5 s
// late). Now each visit of the worker applies one turn of it
// (snapshotTurn records): the honest batch, queued behind the snapshot,
// goes after its first turn; the snapshot's records all reach the sink, in
// order, the first turn as the BlockSnapshot (with the clear in front) and
// the rest as parts; the snapshotting pod's own later batch goes after the
// whole snapshot; and the pod counts a snapshot pending until its last turn.
func TestSnapshotAppliedInTurns(t *testing.T) {
	const n = 5*snapshotTurn + 7
	sink := &turnSink{done: make(chan struct{}), doneN: 6 + 2}
	d := newDispatcher(sink, 1, 64, 256<<20, NewMetrics(nil), slog.New(slog.DiscardHandler))
	var snapOwner, honestOwner streamBacklog
	if !d.queueBounded(0, &snapOwner, snapshotBatch("snap", 5, n)) ||
		!d.queueBounded(0, &honestOwner, &event.Batch{Pod: "honest", Seq: 1}) ||
		!d.queueBounded(0, &snapOwner, &event.Batch{Pod: "snap", Seq: 6}) {
		t.Fatal("not queued")
	}
	if _, pending := snapOwner.state(time.Now()); !pending {
		t.Fatal("a queued snapshot is not pending")
	}
	d.start(context.Background())
	defer d.stop(time.Second)
	select {
	case <-sink.done:
	case <-time.After(testTimeout):
		t.Fatalf("applied only %d items", len(sink.log))
	}
	sink.mu.Lock()
	log := sink.log
	sink.mu.Unlock()
	var got []string
	var records []uint64
	for i, r := range log {
		got = append(got, fmt.Sprintf("%s/%d", r.pod, r.seq))
		if r.pod == "snap" && r.seq == 5 {
			records = append(records, r.records...)
			if first := len(records) == len(r.records); r.part == first {
				t.Errorf("apply %d: part=%v, want %v (only the first turn replaces the pod's state)", i, r.part, !first)
			}
			if want := min(snapshotTurn, n-len(records)+len(r.records)); len(r.records) != want {
				t.Errorf("apply %d: %d records, want %d", i, len(r.records), want)
			}
			if len(r.kinds) != 1 && !(i == 0 && len(r.kinds) == 2 && r.kinds[0] == event.AllBlocksCleared) {
				t.Errorf("apply %d: events %v", i, r.kinds)
			}
		}
	}
	want := []string{"snap/5", "honest/1", "snap/5", "snap/5", "snap/5", "snap/5", "snap/5", "snap/6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	if len(records) != n || records[0] != 1 || records[n-1] != n {
		t.Fatalf("%d records applied, want %d in order", len(records), n)
	}
	for i := range records {
		if records[i] != uint64(i+1) {
			t.Fatalf("record %d is %d", i, records[i])
		}
	}
	if lag, pending := snapOwner.state(time.Now()); pending || lag != 0 || snapOwner.bytes != 0 {
		t.Errorf("after the snapshot: pending %v, lag %v, %d bytes held", pending, lag, snapOwner.bytes)
	}
	if u := d.budget.used.Load(); u != 0 {
		t.Errorf("%d bytes of the budget still taken", u)
	}
}

// A turn the sink fails (index error) cuts the snapshot: its later records
// are not applied (the rest of a failed batch is dropped), and the item is
// still released, its bytes given back, its pod no longer pending.
func TestSnapshotTurnFailureCutsTheRest(t *testing.T) {
	sink := &turnSink{failAt: 2, done: make(chan struct{}), doneN: 3}
	d := newDispatcher(sink, 1, 64, 256<<20, NewMetrics(nil), slog.New(slog.DiscardHandler))
	var owner streamBacklog
	if !d.queueBounded(0, &owner, snapshotBatch("snap", 5, 4*snapshotTurn)) ||
		!d.queueBounded(0, &owner, &event.Batch{Pod: "snap", Seq: 6}) {
		t.Fatal("not queued")
	}
	d.start(context.Background())
	defer d.stop(time.Second)
	select {
	case <-sink.done:
	case <-time.After(testTimeout):
		t.Fatal("not applied")
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.log) != 3 || sink.log[2].seq != 6 {
		t.Fatalf("applied %+v, want two turns then seq 6", len(sink.log))
	}
	if _, pending := owner.state(time.Now()); pending || owner.bytes != 0 || d.budget.used.Load() != 0 {
		t.Errorf("after the cut snapshot: pending %v, %d bytes held, budget %d", pending, owner.bytes, d.budget.used.Load())
	}
}

type nopSink struct{}

func (nopSink) Apply(context.Context, *event.Batch) event.ApplyOutcome { return event.ApplyOutcome{} }
func (nopSink) ForgetPod(context.Context, string, int)                 {}

// A snapshot's turns allocate nothing: each reuses its worker's view.
func TestSnapshotTurnsDoNotAllocate(t *testing.T) {
	d := newDispatcher(nopSink{}, 1, 64, 256<<20, NewMetrics(nil), slog.New(slog.DiscardHandler))
	d.applyCtx = context.Background()
	b := snapshotBatch("snap", 5, 8*snapshotTurn)
	size := batchBytes(b)
	q := d.queues[0]
	round := func() {
		d.budget.used.Add(size)
		q.slots <- struct{}{}
		q.push(queued{batch: b, size: size})
		for {
			it, ok := q.pop()
			if !ok {
				break
			}
			d.applyTimed(0, it)
		}
	}
	round()
	if n := testing.AllocsPerRun(10, round); n != 0 {
		t.Errorf("%v allocations per snapshot of 8 turns", n)
	}
}
