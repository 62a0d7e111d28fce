package kvevents

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

// One engine added for two pods (two tenants' names for it) is read through
// one connection, each message becoming a batch of each pod under its own
// model; removing one pod keeps the connection for the other and clears
// only the removed pod's stream.
func TestSharedEndpointOneConnection(t *testing.T) {
	sink := newCollectSink()
	m := NewMetrics(nil)
	s := startSub(t, Config{}, sink, m)
	pub, err := zmtp.ListenPub("tcp://127.0.0.1:0", zmtp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	addr := "tcp://" + pub.Addr().String()
	for _, ep := range []EndpointConfig{{Pod: "1", Model: `a\m`}, {Pod: "2", Model: `b\m`}} {
		ep.Address, ep.Share, ep.AllTopics = addr, true, true
		if err := s.AddEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []struct {
		ep   EndpointConfig
		want string
	}{
		{EndpointConfig{Pod: "1", Model: "c", Share: true, AllTopics: true}, `already added for pod "1"`},
		{EndpointConfig{Pod: "3", Model: "c", Share: true, AllTopics: true, Engine: blockkeys.EngineSGLang}, "sharers of one address must agree"},
		{EndpointConfig{Pod: "3", Model: "c", Share: true}, "sharers of one address must agree"},
		{EndpointConfig{Pod: "3", Model: "c"}, "already added"},
		{EndpointConfig{Model: "c", Share: true}, "needs a pod name"},
	} {
		bad.ep.Address = addr
		if err := s.AddEndpoint(bad.ep); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("AddEndpoint(%+v) = %v, want an error saying %q", bad.ep, err, bad.want)
		}
	}
	if got := metricValue(m.limits.sharedViews); got != 1 {
		t.Errorf("shared_endpoint_views = %v, want 1", got)
	}
	ctx := testCtx(t)
	for len(pub.Topics()) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the subscriber never subscribed")
		case <-time.After(5 * time.Millisecond):
		}
	}
	send := func(seq uint64, hash uint64) {
		t.Helper()
		var s8 [8]byte
		binary.BigEndian.PutUint64(s8[:], seq)
		if err := pub.Send(ctx, []byte(""), s8[:], payload(t, storedBatch(hash))); err != nil {
			t.Fatal(err)
		}
	}
	send(0, 10)
	bs := sink.waitFor(t, "seq 0 of both pods", func(bs []*event.Batch) bool { return hasSeq("1", 0)(bs) && hasSeq("2", 0)(bs) })
	for _, b := range bs {
		want := map[string]string{"1": `a\m`, "2": `b\m`}[b.Pod]
		if b.Model != want || b.Events[0].BlockHashes[0] != 10 {
			t.Errorf("batch of pod %s: model %q hash %v, want model %q hash 10", b.Pod, b.Model, b.Events[0].BlockHashes, want)
		}
	}
	if st := pub.Stats(); st.Accepted != 1 {
		t.Errorf("the engine accepted %d connections, want 1 (one subscription for both pods)", st.Accepted)
	}
	eps := s.Endpoints()
	if len(eps) != 2 || eps[0].Pod != "1" || eps[1].Pod != "2" || !eps[0].Connected || !eps[1].Connected || eps[1].Model != `b\m` {
		t.Fatalf("endpoints %+v, want pods 1 and 2 at %s, connected", eps, addr)
	}

	if err := s.RemoveEndpointPod(addr, "3"); err == nil {
		t.Error("removing a pod that does not share the address succeeded")
	}
	if err := s.RemoveEndpointPod(addr, "1"); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "clear for pod 1", func(bs []*event.Batch) bool {
		b := bs[len(bs)-1]
		return b.Pod == "1" && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared
	})
	send(1, 11)
	bs = sink.waitFor(t, "seq 1 of pod 2", hasSeq("2", 1))
	if hasSeq("1", 1)(bs) {
		t.Error("the removed pod still receives batches")
	}
	for _, st := range s.Streams() {
		if st.Pod == "1" {
			t.Errorf("the removed pod's stream is still listed: %+v", st)
		}
	}
	if st := pub.Stats(); st.Accepted != 1 {
		t.Errorf("the engine accepted %d connections after one sharer left, want 1 (the connection stays)", st.Accepted)
	}
	if got := metricValue(m.limits.sharedViews); got != 0 {
		t.Errorf("shared_endpoint_views after one left = %v, want 0", got)
	}
	if err := s.RemoveEndpointPod(addr, "2"); err != nil {
		t.Fatal(err)
	}
	if eps := s.Endpoints(); len(eps) != 0 {
		t.Errorf("endpoints after the last sharer left: %+v", eps)
	}
	sink.waitFor(t, "clear for pod 2", func(bs []*event.Batch) bool {
		b := bs[len(bs)-1]
		return b.Pod == "2" && len(b.Events) == 1 && b.Events[0].Kind == event.AllBlocksCleared
	})
}

// At most MaxEndpointShares endpoints share an address; RemoveEndpoint
// removes all of them and frees the address.
func TestSharedEndpointCap(t *testing.T) {
	m := NewMetrics(nil)
	s, err := NewSubscriber(Config{}, newCollectSink(), m, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const addr = "tcp://127.0.0.1:1"
	for i := range MaxEndpointShares {
		if err := s.AddEndpoint(EndpointConfig{Address: addr, Pod: fmt.Sprint(i), Share: true}); err != nil {
			t.Fatal(err)
		}
	}
	err = s.AddEndpoint(EndpointConfig{Address: addr, Pod: "one-more", Share: true})
	if err == nil || !strings.Contains(err.Error(), "the limit") {
		t.Fatalf("sharer %d: %v, want refused at the limit", MaxEndpointShares+1, err)
	}
	if got := metricValue(m.limits.sharedViews); got != MaxEndpointShares-1 {
		t.Errorf("shared_endpoint_views = %v, want %d", got, MaxEndpointShares-1)
	}
	if err := s.RemoveEndpoint(addr); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(m.limits.sharedViews); got != 0 || len(s.Endpoints()) != 0 {
		t.Errorf("after RemoveEndpoint: shared_endpoint_views = %v, endpoints %v", got, s.Endpoints())
	}
	if err := s.AddEndpoint(EndpointConfig{Address: addr, Pod: "x"}); err != nil {
		t.Errorf("the address is not free after RemoveEndpoint: %v", err)
	}
}
