package kvevents

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// replayEngine is a vLLM-style engine (enginepub.ReplayPublisher) whose
// replay answers the test can hold: each request's start is reported on
// requests, and answered only once release gets a value (or the test ends).
type replayEngine struct {
	*enginepub.ReplayPublisher
	topic    string
	requests chan uint64
	release  chan struct{}
	mu       sync.Mutex
	held     bool
}

func startReplayEngine(t *testing.T, pod string, bufferSteps int, hold bool) *replayEngine {
	t.Helper()
	e := &replayEngine{topic: "kv@" + pod + "@m", requests: make(chan uint64, 16), release: make(chan struct{}), held: hold}
	ctx := testCtx(t)
	p, err := enginepub.NewReplayPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", e.topic, bufferSteps, func(start uint64) {
		e.requests <- start
		e.mu.Lock()
		held := e.held
		e.mu.Unlock()
		if held {
			select {
			case <-e.release:
			case <-ctx.Done():
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.ReplayPublisher = p
	return e
}

// answer lets one held request be answered.
func (e *replayEngine) answer(t *testing.T) {
	t.Helper()
	select {
	case e.release <- struct{}{}:
	case <-time.After(testTimeout):
		t.Fatal("no held replay request to release")
	}
}

// request waits for the next replay request and returns its start.
func (e *replayEngine) request(t *testing.T) uint64 {
	t.Helper()
	select {
	case start := <-e.requests:
		return start
	case <-time.After(testTimeout):
		t.Fatal("no replay request")
		return 0
	}
}

func (e *replayEngine) publish(t *testing.T, b *event.Batch) uint64 {
	t.Helper()
	seq, err := e.PublishNext(payload(t, b))
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// rebuildSub subscribes to e (no catch-up: the only replay requests are
// rebuilds) and waits until batches 0..n-1 were published and applied.
func rebuildSub(t *testing.T, e *replayEngine, pod string, n int) (*Subscriber, *collectSink, *Metrics) {
	t.Helper()
	return rebuildSubConfig(t, e, pod, n, Config{DisableCatchUp: true})
}

// rebuildSubConfig is rebuildSub with cfg (its Endpoints set here).
func rebuildSubConfig(t *testing.T, e *replayEngine, pod string, n int, cfg Config) (*Subscriber, *collectSink, *Metrics) {
	t.Helper()
	sink := newCollectSink()
	m := NewMetrics(nil)
	cfg.Endpoints = []EndpointConfig{{Address: e.Addr(), ReplayAddress: e.ReplayAddr()}}
	s := startSub(t, cfg, sink, m)
	if err := e.WaitSubscribed(testCtx(t), e.topic); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		b := storedBatch(uint64(100 + i))
		if i == 2 {
			b = &event.Batch{Events: []event.Event{{Kind: event.BlockRemoved, BlockHashes: []uint64{100}}}}
		}
		e.publish(t, b)
	}
	sink.waitFor(t, fmt.Sprintf("seq %d", n-1), hasSeq(pod, uint64(n-1)))
	return s, sink, m
}

func streamOf(t *testing.T, s *Subscriber, pod string) StreamStats {
	t.Helper()
	for _, st := range s.Streams() {
		if st.Pod == pod {
			return st
		}
	}
	t.Fatalf("no stream %s", pod)
	return StreamStats{}
}

// waitStream polls the stream until cond holds (its outcome is set after
// the batches are queued, by the rebuild's goroutine).
func waitStream(t *testing.T, s *Subscriber, pod, what string, cond func(StreamStats) bool) StreamStats {
	t.Helper()
	var st StreamStats
	wait.Until(t, what, func() string {
		if st = streamOf(t, s, pod); !cond(st) {
			return fmt.Sprintf("%+v", st)
		}
		return ""
	})
	return st
}

// after is the batches applied after the first n.
func after(bs []*event.Batch, n int) []*event.Batch { return bs[n:] }

// eventsOf lists the batches' events in order, each as its kind's initial
// and first hash ("c" for a clear): a rebuild merges the batches it
// replays, so what it must keep is their events' order.
func eventsOf(bs []*event.Batch) string {
	out := ""
	for _, b := range bs {
		for _, ev := range b.Events {
			switch ev.Kind {
			case event.AllBlocksCleared:
				out += "c "
			case event.BlockStored:
				out += fmt.Sprintf("s%d ", ev.BlockHashes[0])
			case event.BlockRemoved:
				out += fmt.Sprintf("r%d ", ev.BlockHashes[0])
			}
		}
	}
	return out
}

// nEvents counts the batches' events.
func nEvents(bs []*event.Batch) int {
	n := 0
	for _, b := range bs {
		n += len(b.Events)
	}
	return n
}

// ascending: every batch's seq is above the one before.
func ascending(bs []*event.Batch) bool {
	for i := 1; i < len(bs); i++ {
		if bs[i].Seq <= bs[i-1].Seq {
			return false
		}
	}
	return true
}

// A vLLM stream whose index entries were lost is rebuilt from the engine's
// replay buffer at once, although the pod is idle: the pod is cleared in
// front of the replayed batches, and the stream says complete again only
// then. It is incomplete ("index_lost") while the rebuild waits.
func TestRebuildAfterIndexLost(t *testing.T) {
	e := startReplayEngine(t, "pod-rb", 100, true)
	s, sink, m := rebuildSub(t, e, "pod-rb", 5)
	before := len(sink.snapshot())
	s.MarkIndexLost("index_lost")
	if start := e.request(t); start != 0 {
		t.Fatalf("rebuild asked the buffer from seq %d, want 0", start)
	}
	if st := streamOf(t, s, "pod-rb"); st.Complete || st.IncompleteReason != "index_lost" || !st.Rebuilding {
		t.Fatalf("during the rebuild: %+v", st)
	}
	e.answer(t)
	st := waitStream(t, s, "pod-rb", "the rebuild's outcome", func(st StreamStats) bool { return !st.Rebuilding })
	if !st.Complete || st.IncompleteReason != "" || st.CompleteSinceSeq != 0 || st.RebuiltBatches != 5 || st.LastSeq != 4 {
		t.Fatalf("after the rebuild: %+v", st)
	}
	got := after(sink.waitFor(t, "the rebuilt batches", func(bs []*event.Batch) bool { return nEvents(bs[before:]) >= 6 }), before)
	// merged into one batch (rebuildMergeBytes), their events in order
	if e := eventsOf(got); e != "c s100 s101 r100 s103 s104 " || len(got) != 1 || got[0].Seq != 4 {
		t.Fatalf("rebuilt %q: %s", e, describe(got))
	}
	if metricValue(m.Rebuilds.WithLabelValues("complete")) != 1 || metricValue(m.RebuiltBatches) != 5 ||
		metricValue(m.SyntheticClears.WithLabelValues("rebuild")) != 1 {
		t.Fatal("rebuild metrics")
	}
	// Live batches go on after it, in order.
	e.publish(t, storedBatch(105))
	bs := sink.waitFor(t, "seq 5", hasSeq("pod-rb", 5))
	if last := bs[len(bs)-1]; last.Seq != 5 || len(last.Events) != 1 || !streamOf(t, s, "pod-rb").Complete {
		t.Fatalf("after the rebuild: %s", describe(bs[before:]))
	}
}

// The stream says complete again once the rebuild has queued the lifetime,
// not once the index has applied it: until then its ApplyLag is above 0.
// Meanwhile the index holds an earlier state of the pod (before the clear,
// or the clear and part of the replayed events: a merged batch is applied
// event by event), so a reader that judges the index by Complete alone, or
// by a block count the rebuild passes through on its way, reads it
// mid-rebuild. ApplyLag 0 is what says every rebuilt batch is applied.
func TestRebuildCompleteWithApplyLagUntilApplied(t *testing.T) {
	e := startReplayEngine(t, "pod-lag", 100, true)
	sink := &pausableSink{collectSink: newCollectSink()}
	s := startSub(t, Config{DisableCatchUp: true,
		Endpoints: []EndpointConfig{{Address: e.Addr(), ReplayAddress: e.ReplayAddr()}}}, sink, NewMetrics(nil))
	if err := e.WaitSubscribed(testCtx(t), e.topic); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.publish(t, storedBatch(uint64(100+i)))
	}
	sink.waitFor(t, "seq 2", hasSeq("pod-lag", 2))
	waitStream(t, s, "pod-lag", "the live batches applied", func(st StreamStats) bool { return st.ApplyLag == 0 })
	before := len(sink.snapshot())
	s.MarkIndexLost("index_lost")
	e.request(t)
	sink.paused.Lock() // the index has not applied the rebuilt batch yet
	paused := true
	defer func() {
		if paused {
			sink.paused.Unlock()
		}
	}()
	e.answer(t)
	st := waitStream(t, s, "pod-lag", "the rebuild's outcome", func(st StreamStats) bool { return !st.Rebuilding })
	if applied := len(sink.snapshot()) - before; !st.Complete || st.ApplyLag <= 0 || applied != 0 {
		t.Fatalf("rebuilt, %d batches of it applied: %+v", applied, st)
	}
	sink.paused.Unlock()
	paused = false
	got := after(sink.waitFor(t, "the rebuilt batch", func(bs []*event.Batch) bool { return len(bs) > before }), before)
	st = waitStream(t, s, "pod-lag", "no apply lag", func(st StreamStats) bool { return st.ApplyLag == 0 })
	if ev := eventsOf(got); ev != "c s100 s101 s102 " || !st.Complete {
		t.Fatalf("applied %q: %+v", ev, st)
	}
}

// A buffer that no longer holds seq 0 cannot prove the pod whole: what it
// holds is rebuilt (behind the clear) and the stream stays incomplete,
// "replay_window", complete since the buffer's first batch.
func TestRebuildWrappedBufferStaysIncomplete(t *testing.T) {
	e := startReplayEngine(t, "pod-wrap", 3, false)
	s, sink, m := rebuildSub(t, e, "pod-wrap", 6)
	before := len(sink.snapshot())
	s.MarkIndexLost("index_lost")
	st := waitStream(t, s, "pod-wrap", "the rebuild's outcome", func(st StreamStats) bool { return st.RebuiltBatches == 3 && !st.Rebuilding })
	if st.Complete || st.IncompleteReason != "replay_window" || st.CompleteSinceSeq != 3 {
		t.Fatalf("after a wrapped rebuild: %+v", st)
	}
	got := after(sink.waitFor(t, "the rebuilt batches", func(bs []*event.Batch) bool { return nEvents(bs[before:]) >= 4 }), before)
	if e := eventsOf(got); e != "c s103 s104 s105 " || !ascending(got) || got[len(got)-1].Seq != 5 {
		t.Fatalf("rebuilt %q: %s", e, describe(got))
	}
	if metricValue(m.Rebuilds.WithLabelValues("replay_window")) != 1 || metricValue(m.Rebuilds.WithLabelValues("complete")) != 0 {
		t.Fatal("rebuild metrics")
	}
	// In-order batches do not make it complete; the engine's clear does.
	e.publish(t, storedBatch(200))
	sink.waitFor(t, "seq 6", hasSeq("pod-wrap", 6))
	if st := streamOf(t, s, "pod-wrap"); st.Complete {
		t.Fatalf("complete from later events: %+v", st)
	}
	e.publish(t, &event.Batch{Events: []event.Event{{Kind: event.AllBlocksCleared}}})
	sink.waitFor(t, "seq 7", hasSeq("pod-wrap", 7))
	if st := streamOf(t, s, "pod-wrap"); !st.Complete {
		t.Fatalf("after the engine's clear: %+v", st)
	}
}

// Live batches published while the rebuild holds the stream wait for it and
// are neither lost nor applied twice nor out of order: those the replay
// already holds are rebuilt in order (their live copies dropped), the next
// one applies live.
func TestRebuildLiveBatchesDuring(t *testing.T) {
	e := startReplayEngine(t, "pod-live", 100, true)
	s, sink, m := rebuildSub(t, e, "pod-live", 5)
	before := len(sink.snapshot())
	s.MarkIndexLost("index_lost")
	e.request(t)
	e.publish(t, storedBatch(105)) // seq 5 and 6, live, while the rebuild holds the stream
	e.publish(t, storedBatch(106))
	e.answer(t)
	waitStream(t, s, "pod-live", "the rebuild's outcome", func(st StreamStats) bool { return !st.Rebuilding })
	e.publish(t, storedBatch(107))
	bs := sink.waitFor(t, "seq 7", hasSeq("pod-live", 7))
	got := after(bs, before)
	if e := eventsOf(got); e != "c s100 s101 r100 s103 s104 s105 s106 s107 " || !ascending(got) {
		t.Fatalf("after the rebuild %q: %s", e, describe(got))
	}
	st := streamOf(t, s, "pod-live")
	if !st.Complete || st.LastSeq != 7 || st.RebuiltBatches != 7 || st.SeqGaps != 0 {
		t.Fatalf("stream %+v", st)
	}
	if metricValue(m.DroppedFrames.WithLabelValues("duplicate")) != 2 || metricValue(m.Rebuilds.WithLabelValues("complete")) != 1 {
		t.Fatal("the live copies of the rebuilt batches 5 and 6 were not dropped as duplicates")
	}
}

// Marks while a rebuild runs start no second one: the stream is queued once,
// the rebuild's outcome is not trusted (the index lost entries again, maybe
// those it queued), and one more rebuild follows it, after the spacing.
func TestRebuildMarkedAgainWhileRunning(t *testing.T) {
	e := startReplayEngine(t, "pod-again", 100, true)
	s, _, m := rebuildSub(t, e, "pod-again", 3)
	s.mu.Lock()
	s.rebuilds.spacing = 0 // the follow-up at once
	s.mu.Unlock()
	s.MarkIndexLost("index_lost")
	e.request(t)
	for range 3 {
		s.MarkIndexLost("index_lost")
		s.markPodIndexLost(streamKey{"pod-again", 0}, "index_error")
	}
	s.mu.Lock()
	st := s.streams[streamKey{"pod-again", 0}]
	queued, workers := len(s.rebuilds.queue), s.rebuilds.workers
	s.mu.Unlock()
	st.mu.Lock()
	again, pending, running := st.rebuildPhase == rebuildRunningAgain, st.rebuildPhase == rebuildPending, st.rebuildPhase >= rebuildRunning
	st.mu.Unlock()
	if queued != 0 || workers != 1 || !again || pending || !running || metricValue(m.limits.rebuildsQueued) != 0 {
		t.Fatalf("during a marked rebuild: queued %d workers %d again %v pending %v running %v", queued, workers, again, pending, running)
	}
	e.answer(t)
	if start := e.request(t); start != 0 {
		t.Fatalf("follow-up rebuild from %d", start)
	}
	if got := streamOf(t, s, "pod-again"); got.Complete || got.IncompleteReason != "index_lost" || !got.Rebuilding {
		t.Fatalf("between the rebuilds: %+v", got)
	}
	e.answer(t)
	got := waitStream(t, s, "pod-again", "the follow-up's outcome", func(st StreamStats) bool { return st.Complete })
	if got.Rebuilding || got.RebuiltBatches != 6 {
		t.Fatalf("after the follow-up: %+v", got)
	}
	if metricValue(m.Rebuilds.WithLabelValues("superseded")) != 1 || metricValue(m.Rebuilds.WithLabelValues("complete")) != 1 {
		t.Fatal("rebuild metrics")
	}
	select {
	case start := <-e.requests:
		t.Fatalf("a third rebuild (from %d)", start)
	default:
	}
}

// A rebuild that cannot reach the engine leaves the stream with its reason.
func TestRebuildFailedKeepsIndexLost(t *testing.T) {
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	sink := newCollectSink()
	m := NewMetrics(nil)
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t)) // nothing listens
	s := startSub(t, Config{DisableCatchUp: true, RebuildTimeout: 200 * time.Millisecond,
		Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
	const topic = "kv@pod-fail@m"
	if err := pub.WaitSubscribed(testCtx(t), topic); err != nil {
		t.Fatal(err)
	}
	pub.Publish(topic, 0, payload(t, storedBatch(1)))
	sink.waitFor(t, "seq 0", hasSeq("pod-fail", 0))
	s.MarkIndexLost("index_lost")
	// counted once the outcome is set
	st := waitStream(t, s, "pod-fail", "the rebuild's outcome", func(StreamStats) bool {
		return metricValue(m.Rebuilds.WithLabelValues("failed")) == 1
	})
	if st.Complete || st.IncompleteReason != "index_lost" || len(sink.snapshot()) != 1 {
		t.Fatalf("after a failed rebuild: %+v, %s", st, describe(sink.snapshot()))
	}
}

// RebuildTimeout, not the gap replay's ReplayTimeout, bounds a rebuild: an
// engine that never answers leaves the pod index_lost once it passes, and
// the pod's live batches, which waited for it, are applied after.
func TestRebuildCutAtRebuildTimeout(t *testing.T) {
	e := startReplayEngine(t, "pod-slow", 100, true) // never answered
	s, sink, m := rebuildSubConfig(t, e, "pod-slow", 3,
		Config{DisableCatchUp: true, ReplayTimeout: time.Hour, RebuildTimeout: 300 * time.Millisecond})
	s.MarkIndexLost("index_lost")
	e.request(t)
	e.publish(t, storedBatch(200)) // seq 3, waits for the rebuild
	st := waitStream(t, s, "pod-slow", "the rebuild's outcome", func(st StreamStats) bool { return !st.Rebuilding })
	if st.Complete || st.IncompleteReason != "index_lost" || metricValue(m.Rebuilds.WithLabelValues("failed")) != 1 {
		t.Fatalf("after the rebuild's bound: %+v", st)
	}
	sink.waitFor(t, "seq 3", hasSeq("pod-slow", 3))
	e.answer(t) // to a connection the daemon gave up on; lets the engine close
}

// Removing the endpoint ends its rebuild in progress: RemoveEndpoint does not
// wait out the replay timeout, and nothing of the rebuild is queued after
// the endpoint's clear.
func TestRemoveEndpointAbandonsRebuild(t *testing.T) {
	e := startReplayEngine(t, "pod-rm", 100, true)
	sink := newCollectSink()
	s := startSub(t, Config{DisableCatchUp: true, RebuildTimeout: 10 * testTimeout,
		Endpoints: []EndpointConfig{{Address: e.Addr(), ReplayAddress: e.ReplayAddr()}}}, sink, nil)
	if err := e.WaitSubscribed(testCtx(t), e.topic); err != nil {
		t.Fatal(err)
	}
	e.publish(t, storedBatch(1))
	sink.waitFor(t, "seq 0", hasSeq("pod-rm", 0))
	s.MarkIndexLost("index_lost")
	e.request(t)
	removed := make(chan error, 1)
	go func() { removed <- s.RemoveEndpoint(e.Addr()) }()
	select {
	case err := <-removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testTimeout):
		t.Fatal("RemoveEndpoint waited for the rebuild")
	}
	e.answer(t) // the engine answers a request nobody waits for any more
	bs := sink.waitFor(t, "the endpoint's clear", func(bs []*event.Batch) bool {
		b := bs[len(bs)-1]
		return len(bs) == 2 && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared
	})
	if len(bs) != 2 {
		t.Fatalf("batches %s", describe(bs))
	}
}

// pausableSink is a collectSink whose Apply waits while paused: an index
// slower than the rebuild queues.
type pausableSink struct {
	*collectSink
	paused sync.RWMutex
}

func (p *pausableSink) Apply(ctx context.Context, b *event.Batch) event.ApplyOutcome {
	p.paused.RLock()
	defer p.paused.RUnlock()
	return p.collectSink.Apply(ctx, b)
}

// A rebuild queues a whole buffer for one pod, far past the pod's share of
// its worker, faster than the index applies it: it waits for room instead
// of overflowing (which would clear the pod and spoil the rebuild).
func TestRebuildWaitsForRoomInItsShare(t *testing.T) {
	const n = 200
	e := startReplayEngine(t, "pod-big", 1000, false)
	sink := &pausableSink{collectSink: newCollectSink()}
	m := NewMetrics(nil)
	// a worker queue of 128 batches: a share of 64 per stream
	s := startSub(t, Config{DisableCatchUp: true, Workers: 1, QueueSize: 128, RebuildTimeout: testTimeout,
		Endpoints: []EndpointConfig{{Address: e.Addr(), ReplayAddress: e.ReplayAddr()}}}, sink, m)
	if share := s.dispatcher.share.batches; share != 64 {
		t.Fatalf("share %d", share)
	}
	s.mu.Lock()
	s.rebuilds.mergeBytes = 1 // one replayed batch per queued batch
	s.mu.Unlock()
	if err := e.WaitSubscribed(testCtx(t), e.topic); err != nil {
		t.Fatal(err)
	}
	for i := range n { // paced: live batches past the share overflow at once
		seq := e.publish(t, storedBatch(uint64(1000+i)))
		sink.waitFor(t, "the live batch", hasSeq("pod-big", seq))
	}
	sink.paused.Lock()
	paused := true
	defer func() {
		if paused {
			sink.paused.Unlock()
		}
	}()
	s.MarkIndexLost("index_lost")
	s.mu.Lock()
	st := s.streams[streamKey{"pod-big", 0}]
	s.mu.Unlock()
	wait.For(t, "the rebuild filling the pod's share", func() bool { return st.backlog.full(1, s.dispatcher.share) })
	sink.paused.Unlock()
	paused = false
	got := waitStream(t, s, "pod-big", "the rebuild's outcome", func(st StreamStats) bool { return !st.Rebuilding })
	if !got.Complete || got.Overflows != 0 || got.RebuiltBatches != n {
		t.Fatalf("after the rebuild: %+v", got)
	}
	bs := sink.waitFor(t, "the rebuilt batches", func(bs []*event.Batch) bool { return len(bs) == 2*n })
	if seqs := seqsOf(bs[n:]); seqs[0] != 0 || seqs[n-1] != n-1 || metricValue(m.QueueOverflows) != 0 {
		t.Fatalf("rebuilt %v", seqs)
	}
}

// A loss of the whole index marks every stream at once: at most
// rebuildWorkers rebuild at a time, the others wait in the queue (each
// once, kvindexd_kvevents_rebuilds_queued), and every one is rebuilt.
func TestRebuildWorkersBounded(t *testing.T) {
	const n = rebuildWorkers + 2
	sink := newCollectSink()
	m := NewMetrics(nil)
	var engines []*replayEngine
	var eps []EndpointConfig
	for i := range n {
		e := startReplayEngine(t, fmt.Sprintf("pod-%d", i), 100, true)
		engines = append(engines, e)
		eps = append(eps, EndpointConfig{Address: e.Addr(), ReplayAddress: e.ReplayAddr()})
	}
	s := startSub(t, Config{DisableCatchUp: true, RebuildTimeout: testTimeout, Endpoints: eps}, sink, m)
	for i, e := range engines {
		if err := e.WaitSubscribed(testCtx(t), e.topic); err != nil {
			t.Fatal(err)
		}
		e.publish(t, storedBatch(uint64(i)))
		sink.waitFor(t, "seq 0", hasSeq(fmt.Sprintf("pod-%d", i), 0))
	}
	s.MarkIndexLost("index_lost")
	s.MarkIndexLost("index_lost")
	// rebuildWorkers requests arrive; the others are queued behind the
	// held ones.
	var asked []int
	deadline := time.Now().Add(testTimeout)
	for len(asked) < rebuildWorkers {
		for i, e := range engines {
			select {
			case <-e.requests:
				asked = append(asked, i)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rebuilds asked by %v only", asked)
		}
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	queued, workers := len(s.rebuilds.queue), s.rebuilds.workers
	s.mu.Unlock()
	if queued != n-rebuildWorkers || workers != rebuildWorkers || metricValue(m.limits.rebuildsQueued) != n-rebuildWorkers {
		t.Fatalf("queued %d, workers %d, want %d and %d", queued, workers, n-rebuildWorkers, rebuildWorkers)
	}
	for _, i := range asked {
		engines[i].answer(t)
	}
	for i, e := range engines {
		if !contains(asked, i) {
			e.request(t)
			e.answer(t)
		}
	}
	for i := range n {
		waitStream(t, s, fmt.Sprintf("pod-%d", i), "rebuilt", func(st StreamStats) bool { return st.Complete && !st.Rebuilding })
	}
	if metricValue(m.Rebuilds.WithLabelValues("complete")) != n {
		t.Fatal("rebuild metrics")
	}
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
