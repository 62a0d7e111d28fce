package promises

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// silentListener accepts TCP connections on 127.0.0.1 and never writes a
// byte: a replay address that never answers (not even the ZMTP greeting).
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return "tcp://" + ln.Addr().String()
}

// TestPromiseReplayTimeout: --replay-timeout bounds one exchange with an
// engine's replay address, connecting included. A replay address that
// accepts and never answers holds a gap's replay, and the stream's batches
// behind it, for that long and no longer: the replay is counted as an
// error, the gap as missed (the pod is listed incomplete, "gap") and the
// batch behind it is applied. The flag is set above the 2 s default, so a
// batch applied sooner would show the default, not the flag, at work; the
// bound's upper side is the suite's wait limit.
func TestPromiseReplayTimeout(t *testing.T) {
	t.Parallel()
	const bound = 3 * time.Second
	pub, err := enginepub.NewPublisher("tcp://127.0.0.1:0", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	const pod = "pod-replay"
	d := harness.Start(t, "--replay-timeout", bound.String(), "--endpoint", pub.Addr()+",pod="+pod+",replay="+silentListener(t))
	ctx, cancel := context.WithTimeout(context.Background(), wait.Limit)
	defer cancel()
	if err := pub.WaitSubscribed(ctx, "kv@"); err != nil {
		t.Fatal(err)
	}
	first, second := prompt(3001, 2), prompt(3002, 2)
	publish(t, pub, pod, model, 0, stored(engineHashes(t, first), first))
	wait.Until(t, "seq 0 applied", func() string {
		if p, ok := d.Pod(pod); !ok || p.LastSeq != 0 || p.Blocks != 2 {
			return fmt.Sprintf("pod %+v", p)
		}
		return ""
	})
	errorsBefore := d.Metric(`kvindexd_kvevents_replays_total{result="error"}`)
	start := time.Now()
	publish(t, pub, pod, model, 2, stored(engineHashes(t, second), second)) // seq 1 never sent: a gap
	wait.Until(t, "the batch behind the gap applied", func() string {
		if p, ok := d.Pod(pod); !ok || p.LastSeq != 2 || p.Blocks != 4 {
			return fmt.Sprintf("pod %+v", p)
		}
		return ""
	})
	if took := time.Since(start); took < bound {
		t.Errorf("the batch behind the gap was applied after %v, before the replay's bound %v", took, bound)
	}
	if p, _ := d.Pod(pod); p.Complete || p.Reason != "gap" {
		t.Errorf("after the replay failed: %+v, want incomplete (gap)", p)
	}
	if v := d.Metric(`kvindexd_kvevents_replays_total{result="error"}`); v != errorsBefore+1 {
		t.Errorf(`kvindexd_kvevents_replays_total{result="error"} = %v, want %v`, v, errorsBefore+1)
	}
	if s := d.ScoreTokens(model, second)[pod]; s != 2 {
		t.Errorf("the batch behind the gap scores %d, want 2", s)
	}
}
