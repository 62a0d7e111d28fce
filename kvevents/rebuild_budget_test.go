package kvevents

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// hostileReplay is an engine whose live batches are honest and whose replay
// address (a ROUTER speaking the replay protocol) never ends its answer:
// "silent" never replies, "repeat" sends seq 0 again and again, "ascend"
// sends seq 0, 1, 2, ... forever. Each holds a rebuild worker for as long
// as the daemon lets it.
type hostileReplay struct {
	*enginepub.Publisher
	router *zmtp.Router
	addr   string
	topic  string
}

func startHostileReplay(t *testing.T, pod, mode string) *hostileReplay {
	t.Helper()
	pub, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	router, err := zmtp.ListenRouter("tcp://127.0.0.1:0", zmtp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	h := &hostileReplay{Publisher: pub, router: router, topic: "kv@" + pod + "@m",
		addr: "tcp://" + router.Addr().String()}
	ctx := testCtx(t)
	body := payload(t, storedBatch(7))
	go func() {
		for {
			msg, err := router.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(msg.Frames) == 0 || mode == "silent" {
				continue // the request is never answered
			}
			id := msg.Frames[0]
			go func() {
				for seq := uint64(0); ctx.Err() == nil; {
					var s8 [8]byte
					binary.BigEndian.PutUint64(s8[:], seq)
					if router.Send(ctx, id, nil, []byte(h.topic), s8[:], body) != nil {
						return // the daemon hung up
					}
					if mode == "ascend" {
						seq++
					}
				}
			}()
		}
	}()
	return h
}

// One replay endpoint's share of the rebuild workers is bounded: with 8
// hostile replay endpoints queued ahead of it (twice rebuildWorkers; silent,
// repeating and endlessly ascending answers), an honest pod the index lost
// is rebuilt within ceil(8/rebuildWorkers) x RebuildAttemptTimeout plus its
// own exchange, although the whole RebuildTimeout is a minute. Before the
// budgets, the silent replays held every worker for the whole RebuildTimeout
// (issue 35: 61 s at the defaults).
func TestRebuildHostileReplaysDoNotStarveHonestPod(t *testing.T) {
	const (
		hostile = 2 * rebuildWorkers
		attempt = time.Second
	)
	modes := []string{"silent", "repeat", "ascend", "silent"}
	honest := startReplayEngine(t, "pod-honest", 100, false)
	var hs []*hostileReplay
	eps := []EndpointConfig{{Address: honest.Addr(), ReplayAddress: honest.ReplayAddr()}}
	for i := range hostile {
		h := startHostileReplay(t, fmt.Sprintf("pod-bad-%d", i), modes[i%len(modes)])
		hs = append(hs, h)
		eps = append(eps, EndpointConfig{Address: h.Addr(), ReplayAddress: h.addr})
	}
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{DisableCatchUp: true, RebuildTimeout: time.Minute, RebuildAttemptTimeout: attempt,
		Endpoints: eps}, sink, m)
	for i, h := range hs {
		if err := h.WaitSubscribed(testCtx(t), h.topic); err != nil {
			t.Fatal(err)
		}
		for seq := range uint64(3) {
			if err := h.Publish(h.topic, seq, payload(t, storedBatch(seq))); err != nil {
				t.Fatal(err)
			}
		}
		sink.waitFor(t, "the hostile pod's batches", hasSeq(fmt.Sprintf("pod-bad-%d", i), 2))
	}
	// The hostile streams are marked first, so they take every worker and
	// the queue's head; the honest one, known only now, queues behind them.
	s.MarkIndexLost("index_lost")
	if err := honest.WaitSubscribed(testCtx(t), honest.topic); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		honest.publish(t, storedBatch(uint64(100+i)))
	}
	sink.waitFor(t, "the honest pod's batches", hasSeq("pod-honest", 2))
	start := time.Now()
	s.MarkIndexLost("index_lost")
	waitStream(t, s, "pod-honest", "the honest pod rebuilt", func(st StreamStats) bool {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the honest pod waited %v for its rebuild: %+v", time.Since(start), st)
		}
		return st.Complete && !st.Rebuilding && st.RebuiltBatches == 3
	})
	took := time.Since(start)
	// ceil(8/4) attempts ahead of it, its own exchange, and room for a
	// loaded machine; far below the minute the silent replays would hold.
	if bound := 2*attempt + 8*time.Second; took > bound {
		t.Fatalf("the honest pod rebuilt after %v, bound %v", took, bound)
	}
	for _, reason := range []string{"rebuild_replay_no_progress", "rebuild_replay_past_asked", "rebuild_replay_attempt_timeout"} {
		if metricValue(m.DroppedFrames.WithLabelValues(reason)) == 0 {
			t.Errorf("no replay cut for %s", reason)
		}
	}
	for i := range hostile {
		if st := streamOf(t, s, fmt.Sprintf("pod-bad-%d", i)); st.Complete && !st.Rebuilding {
			t.Errorf("hostile pod %d says complete: %+v", i, st)
		}
	}
	t.Logf("honest pod rebuilt %v after the mark, behind %d hostile replays", took, hostile)
}

// The budget of one exchange: ascending seqs up to rebuildAheadBatches past
// the last seq seen live, no repeat, and the byte budget.
func TestReplayBudget(t *testing.T) {
	b := newReplayBudget(5, 100)
	for seq := range uint64(5 + rebuildAheadBatches + 1) {
		if err := b.reply(seq, 0, true); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	if err := b.reply(6+rebuildAheadBatches, 0, true); err != errRebuildAhead {
		t.Fatalf("past the asked run: %v", err)
	}
	b = newReplayBudget(5, 100)
	if b.reply(3, 10, true) != nil || b.reply(3, 10, true) != errRebuildNoProgress || newReplayBudget(5, 100).reply(0, 101, true) != errRebuildBytes {
		t.Fatal("repeat or bytes not cut")
	}
	b = newReplayBudget(0, 100)
	for range rebuildAheadBatches + 1 {
		if b.reply(0, 0, false) != nil {
			t.Fatal("malformed replies within the run cut")
		}
	}
	if b.reply(0, 0, false) != errRebuildAhead {
		t.Fatal("malformed replies past the run not cut")
	}
	b = newReplayBudget(^uint64(0)-3, 1<<30)
	if b.reply(^uint64(0)-1, 0, true) != nil {
		t.Fatal("a seq near the top of the range cut")
	}
}
