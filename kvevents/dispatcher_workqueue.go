package kvevents

import "sync"

// A worker serves its streams in turn, not in arrival order. Its queue used
// to be one FIFO channel: with each stream bounded by its share (dispatcher_share.go)
// an honest pod's batch still waited behind every flooding stream's whole
// share on its worker (~4 MiB each, seconds of apply time). Now a worker
// keeps one FIFO per stream that has something queued (a flow) and a ring
// of those flows, served by deficit round robin: each visit gives a flow
// drrQuantum bytes of credit and applies its first batch if the credit
// covers it. So a batch of at most drrQuantum waits behind at most one
// batch of every other flow of its worker (plus the one being applied),
// whatever those flows hold, and a flow of larger batches is served once
// per as many visits as its batch has quanta.
//
// What is kept from the channel:
//   - a stream's items (its batches, the subscriber's clears for it and the
//     order to forget it) stay in order: they share one flow, keyed by the
//     stream's (pod, rank), so a stream forgotten and seen again behind its
//     old clear is still one flow;
//   - the item bound: a worker holds at most --queue-size items, and room is
//     taken with a channel send (slots) so a reader still waits for it in a
//     select with its deadline, its context or shutdown;
//   - no allocation per item: items and flows live in slabs that only grow
//     while more items are queued at once than ever before, never beyond
//     --queue-size; the flow index (byKey) holds the flows with work only.
//
// Bounds: every flow holds at least one item, so a worker has at most
// --queue-size flows; and the flows are streams admitted under
// --max-streams, plus streams forgotten (expiry, endpoint removal) whose
// clear and forget order have not been applied yet. The gauge
// kvindexd_kvevents_active_streams counts them.

// A snapshot (SGLang's, event.BlockSnapshot: a pod's whole state, up to
// 4,194,304 records, 32 MiB) is one queued item like any batch, but it is
// not applied as one: that held every other flow of its worker behind the
// whole of it (issue 35: an update 42.5 s late behind repeated snapshots).
// Each visit of its flow applies one turn of it instead, snapshotTurn
// records (a quantum's worth), and the flow goes to the back of the ring
// with the item still at its head, its slot still held; its last turn
// releases it as any batch. So another flow's batch waits behind at most one
// turn of it; the snapshotting stream's own later items stay behind the
// whole snapshot, in order; and what the item holds (its slot, bytes and
// share) is given back when it is all applied.

// drrQuantum is the credit a flow gets per visit. It is above most engine
// batches (a step's events: a few KB to tens of KB), so an honest batch is
// applied on its stream's first visit; a flooder's ~900 KB batches need
// four visits each.
const drrQuantum = 256 << 10

// snapshotTurn is how many of a snapshot's records one turn applies: a
// quantum's worth at the 8 bytes a record is charged (batchBytes).
const snapshotTurn = drrQuantum / 8

// workQueue is one worker's queue.
type workQueue struct {
	// slots holds a token per queued item (capacity: --queue-size):
	// sending takes room, pop gives it back.
	slots chan struct{}
	// ready wakes the worker; capacity 1, so a push never blocks on it and
	// a wake-up between the worker's empty pop and its wait is not lost.
	ready chan struct{}

	mu       sync.Mutex
	items    []qitem
	flows    []flow
	freeItem int32 // free lists through next; -1 = empty
	freeFlow int32
	byKey    map[streamKey]int32 // flows with work
	// tail is the flow served last; the ring (through flow.next) goes on
	// to the flow served next. -1 = nothing queued.
	tail int32
}

type qitem struct {
	it   queued
	next int32 // the flow's next item, or the free list's
}

// flow is one stream's FIFO on its worker.
type flow struct {
	key        streamKey
	head, last int32 // items; -1 = none
	deficit    int64
	next       int32 // ring, or free list
}

func newWorkQueue(size int) *workQueue {
	return &workQueue{slots: make(chan struct{}, size), ready: make(chan struct{}, 1),
		byKey: map[streamKey]int32{}, freeItem: -1, freeFlow: -1, tail: -1}
}

// key is the stream an item belongs to.
func (it *queued) key() streamKey {
	if it.forget != nil {
		return *it.forget
	}
	return streamKey{pod: it.batch.Pod, rank: it.batch.DPRank}
}

// push queues it behind what its stream has queued. The caller took a slot.
func (q *workQueue) push(it queued) {
	k := it.key()
	q.mu.Lock()
	i := q.newItem(it)
	f, ok := q.byKey[k]
	if !ok {
		f = q.newFlow(k)
		q.byKey[k] = f
		// At the back of the ring: served after every flow already waiting.
		if q.tail < 0 {
			q.flows[f].next = f
		} else {
			q.flows[f].next = q.flows[q.tail].next
			q.flows[q.tail].next = f
		}
		q.tail = f
	}
	fl := &q.flows[f]
	if fl.last < 0 {
		fl.head = i
	} else {
		q.items[fl.last].next = i
	}
	fl.last = i
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop takes the next item by deficit round robin and gives back its slot;
// false when nothing is queued. A snapshot applied in turns comes out once
// per turn, its slot given back with its last (queued.turn says which).
func (q *workQueue) pop() (queued, bool) {
	q.mu.Lock()
	if q.tail < 0 {
		q.mu.Unlock()
		return queued{}, false
	}
	for {
		f := q.flows[q.tail].next
		fl := &q.flows[f]
		first := &q.items[fl.head]
		fl.deficit += drrQuantum
		if n, ok := first.it.inTurns(); ok {
			// One turn per visit, whatever the credit: a turn is a
			// quantum's worth.
			out := first.it
			out.turnEnd = min(out.turnFrom+snapshotTurn, n)
			if out.turnEnd < n {
				first.it.turnFrom = out.turnEnd
				fl.deficit = 0
				q.tail = f // to the back, the rest of the snapshot still queued
				q.mu.Unlock()
				out.turn = turnPart
				return out, true // its slot stays taken: the item is still queued
			}
			out.turn = turnLast
			first.it = out // released below as any batch
		} else if first.it.size > fl.deficit {
			q.tail = f // not yet: to the back, keeping its credit
			continue
		}
		out, next := first.it, first.next
		q.releaseItem(fl.head)
		fl.head, fl.deficit = next, 0
		if next >= 0 {
			q.tail = f // served: to the back
		} else {
			if f == q.tail {
				q.tail = -1
			} else {
				q.flows[q.tail].next = fl.next
			}
			delete(q.byKey, fl.key)
			q.releaseFlow(f)
		}
		q.mu.Unlock()
		<-q.slots
		return out, true
	}
}

// take waits for an item until stop is closed (false then).
func (q *workQueue) take(stop <-chan struct{}) (queued, bool) {
	for {
		if it, ok := q.pop(); ok {
			return it, true
		}
		select {
		case <-q.ready:
		case <-stop:
			return queued{}, false
		}
	}
}

// active is the number of flows with work.
func (q *workQueue) active() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byKey)
}

func (q *workQueue) newItem(it queued) int32 {
	i := q.freeItem
	if i < 0 {
		q.items = append(q.items, qitem{})
		i = int32(len(q.items) - 1)
	} else {
		q.freeItem = q.items[i].next
	}
	q.items[i] = qitem{it: it, next: -1}
	return i
}

func (q *workQueue) releaseItem(i int32) {
	q.items[i] = qitem{next: q.freeItem} // drop the batch for the collector
	q.freeItem = i
}

func (q *workQueue) newFlow(k streamKey) int32 {
	f := q.freeFlow
	if f < 0 {
		q.flows = append(q.flows, flow{})
		f = int32(len(q.flows) - 1)
	} else {
		q.freeFlow = q.flows[f].next
	}
	q.flows[f] = flow{key: k, head: -1, last: -1}
	return f
}

func (q *workQueue) releaseFlow(f int32) {
	q.flows[f] = flow{next: q.freeFlow}
	q.freeFlow = f
}

// activeStreams is how many streams have something queued, over all
// workers (dispatcher_workqueue.go).
func (s *Subscriber) activeStreams() int {
	n := 0
	for _, q := range s.dispatcher.queues {
		n += q.active()
	}
	return n
}
