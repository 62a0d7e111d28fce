package promises

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
	goredis "github.com/redis/go-redis/v9"
)

// TestPromiseRedisClusterFailover: a Redis Cluster master that stops with
// its connections open (SIGSTOP; 3 masters with one replica each,
// cluster-node-timeout 3 s) and is failed over to its replica while still
// stopped. While it is stopped a score on its keys is 503 within the call
// deadline, /readyz is 503, a pod whose write hits it is untrusted, counts
// an index error and is listed incomplete ("index_error"), and a pod whose keys live on the other masters
// keeps being applied and scored. Once the replica is promoted the daemon
// writes to it: the untrusted pod is trusted again, its new blocks are
// scored and /readyz is 200, without the stopped master ever resuming.
func TestPromiseRedisClusterFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterWith(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 3 * time.Second})
	d := harness.Start(t, "--index", cl.URL())
	ctx := context.Background()
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{cl.Nodes[0].Addr()}, Protocol: 2, DisableIdentity: true})
	defer cc.Close()
	masterOf := func(key string) string {
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return n.Options().Addr
	}
	// The stopped master: one that does not hold the pods hash (with it
	// every write fails; redisindex's TestClusterHungPodsHashMaster).
	podsMaster := masterOf("kvindex:pods")
	var stopped, replica *redistest.Server
	for _, s := range cl.Nodes {
		if stopped == nil && s.Role() == "master" && s.Addr() != podsMaster {
			stopped = s
		}
	}
	for _, s := range cl.Nodes {
		if p, _ := s.InfoField("replication", "master_port"); p == strconv.Itoa(stopped.Port()) {
			replica = s
		}
	}
	blockKey := func(h uint64) string { return fmt.Sprintf("kvindex:b:%s:%016x", model, h) }
	// promptOn finds a 2-block prompt with a block on the stopped master
	// (on) or none (!on), from base on.
	next := 100
	promptOn := func(on bool) []uint32 {
		for ; ; next++ {
			toks := prompt(next, 2)
			hit := false
			for _, h := range engineHashes(t, toks) {
				hit = hit || masterOf(blockKey(h)) == stopped.Addr()
			}
			if hit == on {
				next++
				return toks
			}
		}
	}
	// All computed before the stop, while cc's slot map is the one the
	// keys' masters are judged by.
	on0, off0, on1, off1, on2 := promptOn(true), promptOn(false), promptOn(true), promptOn(false), promptOn(true)
	pub := d.Publisher()
	publish(t, pub, "pod-on", model, 0, stored(engineHashes(t, on0), on0))
	publish(t, pub, "pod-off", model, 0, stored(engineHashes(t, off0), off0))
	wait.Until(t, "both pods indexed", func() string {
		if got := d.ScoreTokens(model, on0)["pod-on"]; got != 2 {
			return fmt.Sprintf("pod-on scores %d", got)
		}
		if got := d.ScoreTokens(model, off0)["pod-off"]; got != 2 {
			return fmt.Sprintf("pod-off scores %d", got)
		}
		return ""
	})
	if n, err := cc.Exists(ctx, blockKey(engineHashes(t, on0)[0])).Result(); err != nil || n != 1 {
		t.Fatalf("the block key the test computes is not in Redis (%d, %v): the scenario would prove nothing", n, err)
	}

	stopped.Pause()
	start := time.Now()
	code, body, _ := d.Do("POST", "/v1/score", fmt.Sprintf(`{"model":%q,"token_ids":%s}`, model, jsonIDs(on0)))
	if took := time.Since(start); code != http.StatusServiceUnavailable || !strings.Contains(body, "unavailable") || took > 3*time.Second {
		t.Errorf("score on the stopped master's keys: %d %s after %v, want 503 naming the index within the 1 s call deadline", code, body, took)
	}
	publish(t, pub, "pod-on", model, 1, stored(engineHashes(t, on1), on1))
	publish(t, pub, "pod-off", model, 1, stored(engineHashes(t, off1), off1))
	wait.Until(t, "while the master is stopped", func() string {
		if v := d.Metric(`kvindexd_pod_index_errors_total{pod="pod-on"}`); v < 1 {
			return fmt.Sprintf("pod-on index errors %v", v)
		}
		// Untrusted until cleared: the recovery clears it at once (the pods
		// hash is on a live master); its next write to the stopped master
		// untrusts it again. It stays listed incomplete.
		if p, _ := d.Pod("pod-on"); p.Complete || p.Reason != "index_error" {
			return fmt.Sprintf("pod-on %+v, want incomplete (index_error)", p)
		}
		if code, _ := d.Get("/readyz"); code != http.StatusServiceUnavailable {
			return fmt.Sprintf("/readyz %d", code)
		}
		if got := d.ScoreTokens(model, off1)["pod-off"]; got != 2 {
			return fmt.Sprintf("pod-off scores %d on the batch sent while the master is stopped", got)
		}
		return ""
	})
	if replica.Role() == "master" {
		t.Fatalf("the replica was promoted %v after the stop, before the checks of the stopped master held: they proved nothing", time.Since(start))
	}
	if v := d.Metric(`kvindexd_pod_index_errors_total{pod="pod-off"}`); v != 0 {
		t.Errorf("pod-off, whose keys live on the other masters, counted %v index errors", v)
	}

	wait.Until(t, "the replica promoted", func() string {
		if replica.Role() != "master" {
			return "the stopped master's replica is a " + replica.Role()
		}
		return ""
	})
	promoted := time.Now()
	wait.Until(t, "ready after the failover, the master still stopped", func() string {
		if code, body := d.Get("/readyz"); code != http.StatusOK {
			return fmt.Sprintf("/readyz %d %s", code, body)
		}
		return ""
	})
	ready := time.Since(promoted)
	publish(t, pub, "pod-on", model, 2, stored(engineHashes(t, on2), on2))
	wait.Until(t, "pod-on's batch written to the new master", func() string {
		if got := d.ScoreTokens(model, on2)["pod-on"]; got != 2 {
			return fmt.Sprintf("pod-on scores %d on its batch sent after the failover", got)
		}
		if v := d.Metric(`kvindexd_pod_untrusted{pod="pod-on"}`); v != 0 {
			return fmt.Sprintf("pod-on untrusted %v", v)
		}
		return ""
	})
	t.Logf("promoted %v after the stop; ready %v after the promotion",
		promoted.Sub(start).Round(time.Millisecond), ready.Round(time.Millisecond))
}

// TestPromiseRedisCallDeadline: a Redis that hangs with its connections open
// (DEBUG SLEEP 3) fails a score on its keys with 503 naming the index within
// the 1 s call deadline (retries included) instead of answering 200 when it
// wakes, /readyz is 503 meanwhile, and a write that stalls on it fails at
// the same deadline: the pod is untrusted, then cleared and listed
// incomplete ("index_error") once Redis answers again.
func TestPromiseRedisCallDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--enable-debug-command", "local")
	d := harness.Start(t, "--index", srv.URL())
	pub := d.Publisher()
	toks := prompt(41, 2)
	publish(t, pub, "pod-hung", model, 0, stored(engineHashes(t, toks), toks))
	wait.Until(t, "the first batch", func() string {
		if got := d.ScoreTokens(model, toks)["pod-hung"]; got != 2 {
			return fmt.Sprintf("pod-hung scores %d", got)
		}
		return ""
	})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	slept := make(chan error, 1)
	go func() { slept <- c.Do(context.Background(), "DEBUG", "SLEEP", "3").Err() }()
	probe := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer probe.Close()
	for probe.Ping(context.Background()).Err() == nil {
		time.Sleep(5 * time.Millisecond) // until the sleep has begun
	}
	more := prompt(42, 1)
	publish(t, pub, "pod-hung", model, 1, stored(engineHashes(t, more), more))
	body := fmt.Sprintf(`{"model":%q,"token_ids":%s}`, model, jsonIDs(toks))
	if code, resp, _ := d.Do("POST", "/v1/score", body); code != http.StatusServiceUnavailable || !strings.Contains(resp, "unavailable") {
		t.Errorf("score while Redis hangs: %d %s, want 503 naming the index (the 1 s call deadline)", code, resp)
	}
	// The health check runs every second and fails at its own 1 s
	// deadline: not ready within 2 s of the hang, before the sleep ends.
	for {
		if code, _ := d.Get("/readyz"); code == http.StatusServiceUnavailable {
			break
		}
		select {
		case err := <-slept:
			slept <- err
			t.Fatal("/readyz stayed 200 for the whole 3 s hang")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	wait.Until(t, "the stalled write's pod untrusted, cleared and incomplete", func() string {
		if v := d.Metric(`kvindexd_pod_index_errors_total{dp_rank="0",model="` + model + `",pod="pod-hung"}`); v < 1 {
			return fmt.Sprintf("pod index errors %v", v)
		}
		_, pods := d.Get("/v1/pods")
		if !regexp.MustCompile(`"incomplete_reason":\s*"index_error"`).MatchString(pods) {
			return "/v1/pods: " + pods
		}
		// The node's guard refuses calls until it answers a PING, so a
		// score right after the hang may still be 503: not yet, not wrong.
		scores, err := d.TryScores(map[string]any{"model": model, "token_ids": toks})
		if err != nil {
			return err.Error()
		}
		if got := scores["pod-hung"]; got != 0 {
			return fmt.Sprintf("pod-hung still scores %d blocks from before the failed write", got)
		}
		return ""
	})
}
