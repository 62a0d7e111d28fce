package promises

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// livePeer starts a daemon with the auth scopes and two pods' blocks:
// pod-a (8 blocks) and pod-b (4 blocks), each stream seen from its start
// (seq 0), so the peer has both complete.
func livePeer(t *testing.T, flags ...string) (*harness.Daemon, []uint32, []uint32) {
	t.Helper()
	first := harness.Start(t, append([]string{"--auth-token-file", tokenFile(t)}, flags...)...)
	first.Token = adminToken
	a, b := prompt(61, 8), prompt(62, 4)
	pub := first.Publisher()
	publish(t, pub, "pod-a", model, 0, stored(engineHashes(t, a), a))
	publish(t, pub, "pod-b", model, 0, stored(engineHashes(t, b), b))
	wait.Until(t, "the live peer indexed both pods", func() string {
		if s := first.ScoreTokens(model, a); s["pod-a"] != 8 {
			return fmt.Sprintf("pod-a: %v", s)
		}
		if s := first.ScoreTokens(model, b); s["pod-b"] != 4 {
			return fmt.Sprintf("pod-b: %v", s)
		}
		if p, _ := first.Pod("pod-a"); !p.Complete {
			return fmt.Sprintf("pod-a not complete on the peer: %+v", p)
		}
		return ""
	})
	return first, a, b
}

// --peers: a daemon starting empty copies a live peer's index (admin
// token from --peer-token-file) and resumes each stream at the copy's
// sequence number. A pod whose next batch follows that number is scored
// with everything copied and complete, without any replay from its engine;
// a pod whose next batch leaves a gap (no replay address here) is scored
// but not complete: complete only where the sequence numbers prove it.
func TestPromisePeerRecovery(t *testing.T) {
	t.Parallel()
	first, a, b := livePeer(t)
	// The first peer listed is down: the next one gives the copy.
	dead := "http://127.0.0.1:" + strconv.Itoa(harness.FreePort(t))
	second := harness.Start(t, "--peers", dead+",http://"+first.HTTP, "--peer-token-file", writeFile(t, "peer-token", adminToken+"\n"))
	if v := second.Metric(`kvindexd_peer_recovery_total{result="unreachable"}`); v != 1 {
		t.Errorf(`kvindexd_peer_recovery_total{result="unreachable"} = %v, want 1 (the dead peer)`, v)
	}
	if v := second.Metric(`kvindexd_peer_recovery_total{result="ok"}`); v != 1 {
		t.Fatalf(`kvindexd_peer_recovery_total{result="ok"} = %v, want 1; logs:
%s`, v, harness.LastLines(second.Logs.String(), 20))
	}
	if v := second.Metric("kvindexd_peer_recovery_entries"); v != 12 {
		t.Errorf("kvindexd_peer_recovery_entries = %v, want 12", v)
	}
	if v := first.Metric(`kvindexd_peer_copies_served_total{result="ok"}`); v != 1 {
		t.Errorf(`the peer's kvindexd_peer_copies_served_total{result="ok"} = %v, want 1`, v)
	}
	if p, ok := second.Pod("pod-a"); !ok || !p.Stale || p.Complete {
		t.Errorf("pod-a before its stream resumes: %+v (listed %v), want stale, not complete", p, ok)
	}
	if s := second.ScoreTokens(model, a); len(s) != 0 {
		t.Errorf("a copied pod is scored before its stream resumes: %v", s)
	}
	pub := second.Publisher()
	nextA, nextB := prompt(63, 1), prompt(64, 1)
	publish(t, pub, "pod-a", model, 1, stored(engineHashes(t, nextA), nextA))
	publish(t, pub, "pod-b", model, 5, stored(engineHashes(t, nextB), nextB))
	wait.Until(t, "both streams resumed on the copy", func() string {
		if s := second.ScoreTokens(model, a); s["pod-a"] != 8 {
			return fmt.Sprintf("pod-a's copied prefix: %v", s)
		}
		if s := second.ScoreTokens(model, nextA); s["pod-a"] != 1 {
			return fmt.Sprintf("pod-a's event after the copy: %v", s)
		}
		if s := second.ScoreTokens(model, b); s["pod-b"] != 4 {
			return fmt.Sprintf("pod-b's copied prefix: %v", s)
		}
		return ""
	})
	if p, _ := second.Pod("pod-a"); !p.Complete || p.Stale {
		t.Errorf("pod-a resumed in order after the copy: %+v, want complete", p)
	}
	if p, _ := second.Pod("pod-b"); p.Complete {
		t.Errorf("pod-b resumed after a gap nothing replayed: %+v, want not complete", p)
	}
}

// A copy is refused, and the daemon starts cold, counted and logged, when
// the peer keys blocks otherwise (--hash-seed), when the copy is larger than
// --peer-max-bytes, or when the token is not an admin token.
func TestPromisePeerRecoveryRefused(t *testing.T) {
	t.Parallel()
	first, _, _ := livePeer(t)
	// ~270 blocks make the copy larger than the smallest --peer-max-bytes.
	big := prompt(65, 270)
	publish(t, first.Publisher(), "pod-c", model, 0, stored(engineHashes(t, big), big))
	wait.Until(t, "pod-c indexed", func() string {
		if s := first.ScoreTokens(model, big); s["pod-c"] != 270 {
			return fmt.Sprintf("pod-c: %v", s)
		}
		return ""
	})
	admin := writeFile(t, "peer-token", adminToken)
	for _, tc := range []struct {
		name, result, log string
		flags             []string
	}{
		{"hash_seed", "hash_config", "block-key configuration", []string{"--hash-seed", "7", "--peer-token-file", admin}},
		{"too_large", "too_large", "--peer-max-bytes", []string{"--peer-max-bytes", "1024", "--peer-token-file", admin}},
		{"read_token", "unauthorized", "admin scope", []string{"--peer-token-file", writeFile(t, "read-token", readToken)}},
		{"no_token", "unauthorized", "401", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := harness.Start(t, append([]string{"--peers", "http://" + first.HTTP}, tc.flags...)...)
			if v := d.Metric(fmt.Sprintf(`kvindexd_peer_recovery_total{result=%q}`, tc.result)); v != 1 {
				t.Errorf("kvindexd_peer_recovery_total{result=%q} = %v, want 1", tc.result, v)
			}
			if v := d.Metric(`kvindexd_peer_recovery_total{result="ok"}`); v != 0 {
				t.Errorf(`kvindexd_peer_recovery_total{result="ok"} = %v, want 0`, v)
			}
			if ps := d.Pods(); len(ps) != 0 {
				t.Errorf("a refused copy's pods are listed: %+v", ps)
			}
			if logs := d.Logs.String(); !strings.Contains(logs, tc.log) || !strings.Contains(logs, "cold start") {
				t.Errorf("logs do not say why (%q) and that the start is cold:\n%s", tc.log, harness.LastLines(logs, 10))
			}
		})
	}
	if v := first.Metric(`kvindexd_peer_copies_served_total{result="hash_config"}`); v != 1 {
		t.Errorf(`the peer's kvindexd_peer_copies_served_total{result="hash_config"} = %v, want 1`, v)
	}
}

// --peer-timeout bounds the recovery: a peer that accepts the connection
// and never answers costs the daemon that long, then it starts cold.
func TestPromisePeerRecoveryTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var held []net.Conn // open, never answered
		defer func() {
			for _, c := range held {
				c.Close()
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
	t0 := time.Now()
	d := harness.Start(t, "--peers", "http://"+ln.Addr().String(), "--peer-timeout", "1s")
	if took := time.Since(t0); took < time.Second {
		t.Errorf("ready after %v, before the 1 s deadline", took)
	}
	if v := d.Metric(`kvindexd_peer_recovery_total{result="timeout"}`); v != 1 {
		t.Errorf(`kvindexd_peer_recovery_total{result="timeout"} = %v, want 1`, v)
	}
	if logs := d.Logs.String(); !strings.Contains(logs, "--peer-timeout") || !strings.Contains(logs, "cold start") {
		t.Errorf("logs do not name the deadline and the cold start:\n%s", harness.LastLines(logs, 10))
	}
}

// TestPromisePeerTokenServesCopyOnly: replicas started alike with one
// --peer-token-file and no token file or admin API (the Helm chart's
// replicas) recover from each other: the token takes the copy, and nothing
// else (endpoint management stays off; the copy without it is refused).
func TestPromisePeerTokenServesCopyOnly(t *testing.T) {
	t.Parallel()
	const token = "peer-token-0123456789abcdef"
	tokenFile := writeFile(t, "peer-token", token+"\n")
	first := harness.Start(t, "--peer-token-file", tokenFile)
	a := prompt(66, 8)
	publish(t, first.Publisher(), "pod-a", model, 0, stored(engineHashes(t, a), a))
	wait.Until(t, "the live replica indexed pod-a", func() string {
		if s := first.ScoreTokens(model, a); s["pod-a"] != 8 {
			return fmt.Sprintf("pod-a: %v", s)
		}
		return ""
	})
	if code, body := first.Get("/v1/admin/snapshot"); code != http.StatusForbidden {
		t.Errorf("the copy without the peer token: %d %s, want 403", code, body)
	}
	first.Token = token
	if code, body, _ := first.Do("POST", "/v1/endpoints", `{"address":"tcp://127.0.0.1:1"}`); code != http.StatusForbidden {
		t.Errorf("POST /v1/endpoints with the peer token: %d %s, want 403 (the token grants the copy only)", code, body)
	}
	first.Token = ""
	second := harness.Start(t, "--peers", "http://"+first.HTTP, "--peer-token-file", tokenFile)
	if v := second.Metric(`kvindexd_peer_recovery_total{result="ok"}`); v != 1 {
		t.Fatalf(`kvindexd_peer_recovery_total{result="ok"} = %v, want 1; logs:
%s`, v, harness.LastLines(second.Logs.String(), 20))
	}
	if v := second.Metric("kvindexd_peer_recovery_entries"); v != 8 {
		t.Errorf("kvindexd_peer_recovery_entries = %v, want 8", v)
	}
}
