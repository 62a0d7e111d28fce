package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/indextest"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// An event worker stuck inside one index write past ApplyStallTimeout makes
// the daemon not ready, on /readyz's reason and grpc.health.v1, with one log
// line; when the write returns it is ready again by itself. (The in-memory
// index cannot be unhealthy: the apply path is the only cause here.)
func TestStalledApplyPathIsNotReadyAndRecovers(t *testing.T) {
	hung := indextest.NewHeldIndex()
	ctx, cancel := context.WithCancel(context.Background())
	x, err := indexer.New(ctx, indexer.Config{Keys: testKeys, Registry: prometheus.NewRegistry(),
		Backend: func(context.Context, *kvindex.Interner) (indexer.Backend, error) {
			return indexer.Backend{Index: hung}, nil
		},
		Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0", Workers: 2}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	pub, err := enginepub.NewPublisher(x.Subscriber().BindAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		pub.Close()
		cancel()
		<-done
		_ = x.Close()
	}()
	var logs logtest.Buffer
	srv, err := New(Config{Indexer: x, Subscriber: x.Subscriber(), Registry: prometheus.NewRegistry(),
		Logger: logs.Logger(), ApplyStallTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.CheckHealth(ctx); err != nil {
		t.Fatalf("idle apply path: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := pub.WaitSubscribed(wctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	hung.Hold()
	p, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: []event.Event{{Kind: event.BlockStored,
		BlockHashes: []uint64{1, 2}, BlockSize: testBlock}}}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("kv@pod-h@"+testModel, 0, p); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hung.Entered():
	case <-wctx.Done():
		t.Fatal("the write never reached the index")
	}
	waitReady(t, srv, false)
	if ok, why := srv.Ready(); ok || !strings.HasPrefix(why, "apply path stalled: ") {
		t.Fatalf("Ready = %v, %q", ok, why)
	}
	if hc, err := srv.healthSrv.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || hc.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("grpc health %v, %v", hc, err)
	}
	hung.Release()
	waitReady(t, srv, true)
	if hc, err := srv.healthSrv.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health %v, %v", hc, err)
	}
	for _, want := range []string{`msg="apply path stalled: not ready"`, `msg="apply path moving again: ready"`} {
		if n := strings.Count(logs.String(), want); n != 1 {
			t.Errorf("%s logged %d times:\n%s", want, n, logs.String())
		}
	}
}

// waitReady runs the health check until readiness is want.
func waitReady(t *testing.T, srv *Server, want bool) {
	t.Helper()
	wait.Until(t, fmt.Sprintf("readiness %v", want), func() string {
		_ = srv.CheckHealth(context.Background())
		if ok, why := srv.Ready(); ok != want {
			return fmt.Sprintf("Ready = %v (%s)", ok, why)
		}
		return ""
	})
}

// Both transports tell the router, per pod, what the event path knows: a
// pod whose scored rank joined its stream late is incomplete with the
// reason, and a pod whose newest batch still waits to be applied has an
// apply lag.
func TestScoreStalenessBothTransports(t *testing.T) {
	hung := indextest.NewHeldIndex()
	st := newStackWith(t, indexer.Config{Keys: testKeys,
		Backend: func(context.Context, *kvindex.Interner) (indexer.Backend, error) {
			return indexer.Backend{Index: hung}, nil
		},
		Events: &kvevents.Config{Bind: "tcp://127.0.0.1:0", Workers: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.idx.Run(ctx) }()
	release := hung.Release
	t.Cleanup(func() { release(); cancel(); <-done })
	pub, err := enginepub.NewPublisher(st.idx.Subscriber().BindAddr(), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := pub.WaitSubscribed(wctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(1000, 4*testBlock)
	publishStored := func(pod string, seq uint64, tokens []uint32) {
		p, err := enginepub.EncodeVLLMBatch(&event.Batch{Events: []event.Event{st.storedEv(tokens, 4)}}, enginepub.VLLMEncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("kv@"+pod+"@"+testModel, seq, p); err != nil {
			t.Fatal(err)
		}
	}
	publishStored("pod-late", 5, prompt) // after its seq 0, and no replay endpoint: joined late
	publishStored("pod-lag", 0, prompt)
	ids, _ := json.Marshal(prompt)
	body := `{"model":"` + testModel + `","token_ids":` + string(ids) + `}`
	pods := func() map[string]map[string]json.RawMessage {
		code, b := st.post("/v1/score", body)
		if code != http.StatusOK {
			t.Fatalf("POST /v1/score: %d %s", code, b)
		}
		var out struct {
			Pods []map[string]json.RawMessage `json:"pods"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		m := map[string]map[string]json.RawMessage{}
		for _, p := range out.Pods {
			var name string
			_ = json.Unmarshal(p["pod"], &name)
			m[name] = p
		}
		return m
	}
	wait.For(t, "the pods' batches in scores", func() bool { return len(pods()) >= 2 })
	hung.Hold()
	publishStored("pod-lag", 1, seqTokens(9000, 4*testBlock)) // new blocks: its worker hangs in their write
	select {
	case <-hung.Entered():
	case <-wctx.Done():
		t.Fatal("the write never reached the index")
	}

	h := pods()
	g, err := st.grpc.Score(ctx, &kvindexv1.ScoreRequest{Model: testModel,
		Input: &kvindexv1.ScoreRequest_TokenIds{TokenIds: &kvindexv1.TokenIDs{Ids: prompt}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Pods) != 2 {
		t.Fatalf("gRPC pods %v", g.Pods)
	}
	for _, gp := range g.Pods {
		hp := h[gp.Pod]
		var lag float64
		var complete bool
		var reason string
		_ = json.Unmarshal(hp["apply_lag_seconds"], &lag)
		_ = json.Unmarshal(hp["complete"], &complete)
		_ = json.Unmarshal(hp["incomplete_reason"], &reason)
		switch gp.Pod {
		case "pod-late":
			if gp.Complete || gp.IncompleteReason != "joined_late" || complete || reason != "joined_late" {
				t.Errorf("pod-late: gRPC complete=%v %q, HTTP complete=%v %q; want incomplete, joined_late",
					gp.Complete, gp.IncompleteReason, complete, reason)
			}
		case "pod-lag":
			if !gp.Complete || !complete || gp.ApplyLagSeconds <= 0 || lag <= 0 {
				t.Errorf("pod-lag: gRPC complete=%v lag=%v, HTTP complete=%v lag=%v; want complete and lagging",
					gp.Complete, gp.ApplyLagSeconds, complete, lag)
			}
		}
	}
}
