package kvevents

import (
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
)

// Completeness through the socket path: a gap without replay, a stream
// joined late, the engine's own clear, SGLang's epoch and barrier topics.
func TestCompletenessAndSGLangTopics(t *testing.T) {
	sink := newCollectSink()
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0"}, sink, nil)
	pub := startPub(t, s.BindAddr(), false)
	if err := pub.WaitSubscribed(testCtx(t), "kv@"); err != nil {
		t.Fatal(err)
	}
	cleared := &event.Batch{Events: []event.Event{{Kind: event.AllBlocksCleared}}}
	for _, m := range []struct {
		topic string
		seq   uint64
		b     *event.Batch
	}{
		{"kv@pod-g@m", 0, storedBatch(1)},
		{"kv@pod-g@m", 1, storedBatch(2)},
		{"kv@pod-g@m", 5, storedBatch(3)}, // gap, no replay endpoint
		{"kv@pod-l@m", 7, storedBatch(4)}, // joined late
		{"kv@pod-c@m", 3, storedBatch(5)},
		{"kv@pod-c@m", 4, cleared}, // the engine's own clear: complete again
		{"kv@pod-e@m\x00sgl-kv-epoch=a", 0, storedBatch(6)},
		{"kv@pod-e@m\x00sgl-kv-epoch=a", 1, storedBatch(7)},
		{"kv@pod-e@m\x00sgl-kv-epoch=b", 2, storedBatch(8)}, // new lifetime: a restart even though seq went forward
		{"kv@pod-e@m\x00sgl-kv-epoch=b\x00sgl-kv-snapshot=cut-1", 3, &event.Batch{}},
	} {
		if err := pub.Publish(m.topic, m.seq, payload(t, m.b)); err != nil {
			t.Fatal(err)
		}
	}
	bs := sink.waitFor(t, "pod-e seq 3", hasSeq("pod-e", 3))
	for _, b := range bs {
		if b.Model != "m" {
			t.Fatalf("model %q: topic metadata in the name", b.Model)
		}
	}
	var restart *event.Batch
	for _, b := range bs {
		if b.Pod == "pod-e" && b.Seq == 2 {
			restart = b
		}
	}
	if restart == nil || len(restart.Events) != 2 || restart.Events[0].Kind != event.AllBlocksCleared {
		t.Fatalf("epoch change did not clear: %s", describe(bs))
	}
	got := map[string]StreamStats{}
	for _, st := range s.Streams() {
		got[st.Pod] = st
	}
	for pod, want := range map[string]struct {
		complete bool
		since    uint64
		why      string
	}{
		"pod-g": {false, 5, "gap"},
		"pod-l": {false, 7, "joined_late"},
		"pod-c": {true, 4, ""},
		"pod-e": {false, 2, "restart"}, // a new lifetime first seen at seq 2: 0 and 1 missed
	} {
		st := got[pod]
		if st.Complete != want.complete || st.CompleteSinceSeq != want.since || st.IncompleteReason != want.why {
			t.Errorf("%s: %+v, want %+v", pod, st, want)
		}
	}
	if st := got["pod-e"]; st.Epoch != "b" || st.Restarts != 1 {
		t.Errorf("pod-e %+v", st)
	}
}

func TestSplitTopicMeta(t *testing.T) {
	for _, tc := range []struct{ topic, base, epoch, barrier string }{
		{"kv@p@m", "kv@p@m", "", ""},
		{"kv@p@m\x00sgl-kv-epoch=e1", "kv@p@m", "e1", ""},
		{"kv@p@m\x00sgl-kv-epoch=e1\x00sgl-kv-snapshot=b9", "kv@p@m", "e1", "b9"},
		{"kv@p@m\x00future-meta", "kv@p@m", "", ""},
	} {
		b, e, r := splitTopicMeta([]byte(tc.topic))
		if string(b) != tc.base || string(e) != tc.epoch || string(r) != tc.barrier {
			t.Errorf("%q: (%q, %q, %q)", tc.topic, b, e, r)
		}
	}
}
