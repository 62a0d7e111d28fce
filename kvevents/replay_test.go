package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/internal/enginepub"
	"github.com/kvindex/kvindex/kvindex"
)

// serveReplay answers vLLM replay requests (>= 0.26 format) from buf on a
// pure-Go ROUTER until ctx ends.
func serveReplay(t *testing.T, ctx context.Context, topic string, buf map[uint64][]byte, order []uint64) string {
	t.Helper()
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(discardZMQLog))
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Close() })
	go func() {
		for {
			msg, err := router.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			for _, seq := range order {
				if seq >= start {
					var s8 [8]byte
					binary.BigEndian.PutUint64(s8[:], seq)
					router.SendMulti(zmq4.NewMsgFrom(id, nil, []byte(topic), s8[:], buf[seq]))
				}
			}
			router.SendMulti(zmq4.NewMsgFrom(id, nil, []byte(topic), endSeq[:], nil))
		}
	}()
	return "tcp://" + router.Addr().String()
}

func TestReplayPartialAndUnreachable(t *testing.T) {
	const topic = "kv@pod-g@m"
	for _, tc := range []struct {
		name       string
		serve      bool
		wantSeqs   []uint64
		wantResult string
		replayed   uint64
	}{
		// the engine's buffer no longer has seq 2: seq 1 is recovered, the
		// gap is reported as partial, and the live batch still applies
		{"partial", true, []uint64{0, 1, 3}, "partial", 1},
		{"unreachable", false, []uint64{0, 3}, "error", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pub, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			p := map[uint64][]byte{}
			for seq := uint64(0); seq < 4; seq++ {
				p[seq] = payload(t, storedBatch(seq+50))
			}
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			if tc.serve {
				replay = serveReplay(t, ctx, topic, p, []uint64{1, 3})
			}
			sink := newCollectSink()
			m := NewMetrics(nil)
			s := startSub(t, Config{Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, m)
			pub.WaitSubscribed(ctx, topic)
			pub.Publish(topic, 0, p[0])
			pub.Publish(topic, 3, p[3])
			bs := sink.waitFor(t, "seq 3", hasSeq("pod-g", 3))
			var got []uint64
			for _, b := range bs {
				got = append(got, b.Seq)
				if b.Events[0].Kind != kvindex.BlockStored || b.Events[0].BlockHashes[0] != b.Seq+50 {
					t.Fatalf("batch %s", describe([]*kvindex.Batch{b}))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantSeqs) {
				t.Fatalf("seqs %v, want %v", got, tc.wantSeqs)
			}
			if v := metricValue(m.Replays.WithLabelValues(tc.wantResult)); v != 1 {
				t.Fatalf("replays{%s} = %v", tc.wantResult, v)
			}
			if st := s.Streams()[0]; st.MissedBatches != 2 || st.ReplayedBatches != tc.replayed {
				t.Fatalf("stream %+v", st)
			}
		})
	}
}
