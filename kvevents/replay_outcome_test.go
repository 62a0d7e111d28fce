package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// startSubLog is startSub with the subscriber's log written to the result.
func startSubLog(t *testing.T, cfg Config, sink event.Sink, m *Metrics) (*Subscriber, *logtest.Buffer) {
	t.Helper()
	lb := &logtest.Buffer{}
	return startSubLogger(t, cfg, sink, m, lb.Logger()), lb
}

// What a gap replay makes of the stream, for each shape of the engine's
// answer to a gap of seqs 1 and 2 (live 0, then live 3): the whole gap
// (repaired: the stream stays complete), the gap without its start (the
// engine's buffer moved on: complete again from the first recovered
// batch), the gap without its end (incomplete from the live batch). Event
// errors in replayed batches are counted on the stream, and the log says
// how it went (a warning unless everything came back).
func TestReplayOutcomeShapes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		served   []uint64
		seqs     string
		complete bool
		since    uint64
		why      string
		result   string
		level    string
	}{
		{"whole_gap", []uint64{1, 2}, "[0 1 2 3]", true, 0, "", "ok", "INFO"},
		{"start_gone", []uint64{2}, "[0 2 3]", false, 2, "replay_window", "partial", "WARN"},
		{"end_missing", []uint64{1}, "[0 1 3]", false, 3, "gap", "partial", "WARN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "kv@pod-" + tc.name + "@m"
			ctx := testCtx(t)
			pub := startPub(t, "tcp://127.0.0.1:0", true)
			p := storedPayloads(t, 4, 50)
			// each replayed batch carries one event of an unknown type
			for _, seq := range tc.served {
				p[seq] = encodeValue(t, []any{1.0, []any{[]any{"BlockRemoved", []uint64{seq + 50}}, []any{"BlockTeleported"}}})
			}
			replay := serveReplay(t, ctx, "tcp://127.0.0.1:0", topic, p, tc.served)
			sink := newCollectSink()
			s, lb := startSubLog(t, Config{DisableCatchUp: true, Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay}}}, sink, NewMetrics(nil))
			pub.WaitSubscribed(ctx, topic)
			pub.Publish(topic, 0, p[0])
			pub.Publish(topic, 3, p[3])
			bs := sink.waitFor(t, "seq 3", hasSeq("pod-"+tc.name, 3))
			got := seqsOf(bs)
			if fmt.Sprint(got) != tc.seqs {
				t.Fatalf("seqs %v, want %s", got, tc.seqs)
			}
			st := s.Streams()[0]
			if st.Complete != tc.complete || st.CompleteSinceSeq != tc.since || st.IncompleteReason != tc.why {
				t.Fatalf("stream complete=%v since %d (%q), want %v since %d (%q)", st.Complete, st.CompleteSinceSeq, st.IncompleteReason, tc.complete, tc.since, tc.why)
			}
			if st.DecodeErrors != uint64(len(tc.served)) {
				t.Fatalf("decode errors %d, want one per replayed batch (%d)", st.DecodeErrors, len(tc.served))
			}
			line := lb.Line(`msg="replay finished"`)
			for _, want := range []string{"level=" + tc.level, " from=1 ", " to=3 ", fmt.Sprintf(" recovered=%d ", len(tc.served)), " wanted=2 ", " result=" + tc.result} {
				if !strings.Contains(line, want) {
					t.Fatalf("log line %q lacks %q", line, want)
				}
			}
		})
	}
}

// Catch-up names a batch after its topic, unless the endpoint overrides
// the pod or the model: each name on its own.
func TestCatchUpNamesFromTopicUnlessOverridden(t *testing.T) {
	for _, tc := range []struct {
		name, pod, model, wantPod, wantModel string
	}{
		{"topic", "", "", "pod-t", "m-t"},
		{"model_set", "", "m-set", "pod-t", "m-set"},
		{"pod_set", "pod-set", "", "pod-set", "m-t"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pub := startPub(t, "tcp://127.0.0.1:0", true)
			p := map[uint64][]byte{0: payload(t, storedBatch(90))}
			replay := serveReplay(t, ctx, "tcp://127.0.0.1:0", "kv@pod-t@m-t", p, []uint64{0})
			sink := newCollectSink()
			startSub(t, Config{Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay, Pod: tc.pod, Model: tc.model}}}, sink, NewMetrics(nil))
			bs := sink.waitFor(t, "caught up seq 0", hasSeq(tc.wantPod, 0))
			if len(bs) != 1 || bs[0].Model != tc.wantModel {
				t.Fatalf("catch-up batches %s, want model %q", describe(bs), tc.wantModel)
			}
		})
	}
}

// Replies without a topic (vLLM <= 0.25, SGLang) name no model: when the
// endpoint names none either, a caught-up batch of a stream not seen yet is
// left out and counted as unattributed (never indexed under an empty model
// name), while one of a stream whose model is known is taken under it.
func TestCatchUpLeavesOutUnattributedBatches(t *testing.T) {
	ctx := testCtx(t)
	pub := startPub(t, "tcp://127.0.0.1:0", true)
	p := map[uint64][]byte{0: payload(t, storedBatch(90)), 1: payload(t, storedBatch(91))}
	replay := serveReplay(t, ctx, "tcp://127.0.0.1:0", "", p, []uint64{0, 1})
	sink := newCollectSink()
	_, lb := startSubLog(t, Config{Endpoints: []EndpointConfig{{Address: pub.Addr(), ReplayAddress: replay, Pod: "pod-u"}}}, sink, NewMetrics(nil))
	wait.For(t, "the catch-up log line", func() bool { return lb.Line(`msg="caught up from the engine's replay buffer"`) != "" })
	if line := lb.Line(`msg="caught up from the engine's replay buffer"`); !strings.Contains(line, " batches=0 ") || !strings.Contains(line, " unattributed=2 ") {
		t.Fatalf("catch-up log %q, want 0 batches and 2 unattributed", line)
	}
	if bs := sink.snapshot(); len(bs) != 0 {
		t.Fatalf("unattributed batches were applied: %s", describe(bs))
	}
}

// A replay exchange that fails on the reply reports the cause, not only
// where it failed (the deadline is the cause only once it has passed).
func TestReplayExchangeKeepsTheCause(t *testing.T) {
	ctx := testCtx(t)
	addr := serveReplay(t, ctx, "tcp://127.0.0.1:0", "kv@pod-x@m", map[uint64][]byte{0: payload(t, storedBatch(1))}, []uint64{0})
	errBad := errors.New("reply not understood")
	err := dealerExchange(ctx, addr, testTimeout, zmtp.Options{}, make([]byte, 8), func([][]byte) (bool, error) { return false, errBad })
	if !errors.Is(err, errBad) || !strings.Contains(err.Error(), "reply") {
		t.Fatalf("exchange error %v, want it to wrap %v", err, errBad)
	}
}

// Catch-up at connect resumes after the lowest last seq of the streams that
// came through that endpoint only: another endpoint's streams say nothing
// about where this one's engine is.
func TestResumeSeqCountsTheEndpointsOwnStreams(t *testing.T) {
	s, a, m := handleOnly(t, Config{}, nil)
	b := &source{addr: "other", msgs: m.MessagesReceived.WithLabelValues("connect")}
	ctx := context.Background()
	s.handle(ctx, a, frames(t, "kv@pod-a@m", 40, storedBatch(40)))
	s.handle(ctx, a, frames(t, "kv@pod-a2@m", 30, storedBatch(30)))
	s.handle(ctx, b, frames(t, "kv@pod-b@m", 7, storedBatch(7)))
	if from, known := s.resumeSeq(a); !known || from != 31 {
		t.Errorf("endpoint a resumes from %d (known %v), want 31", from, known)
	}
	if from, known := s.resumeSeq(b); !known || from != 8 {
		t.Errorf("endpoint b resumes from %d (known %v), want 8", from, known)
	}
	c := &source{addr: "new", msgs: m.MessagesReceived.WithLabelValues("connect")}
	if from, known := s.resumeSeq(c); known || from != 0 {
		t.Errorf("an endpoint with no streams resumes from %d (known %v), want 0, unknown", from, known)
	}
	// Adjacent last seqs, in whatever order the streams are walked (map
	// order differs from run to run): the lower one decides.
	for range 20 {
		s, a, _ := handleOnly(t, Config{}, nil)
		s.handle(ctx, a, frames(t, "kv@pod-x@m", 29, storedBatch(29)))
		s.handle(ctx, a, frames(t, "kv@pod-y@m", 30, storedBatch(30)))
		if from, _ := s.resumeSeq(a); from != 30 {
			t.Fatalf("streams at 29 and 30 resume from %d, want 30", from)
		}
	}
}
