package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvindex"
	"github.com/kvindex/kvindex/kvindex/redisindex"
	"github.com/kvindex/kvindex/kvindex/redisindex/redistest"
)

// cutProxy forwards loopback TCP connections to target until Cut, which
// closes the listener and every connection: to the daemon behind it Redis
// is gone, as if the daemon itself had died (it can release nothing).
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(p.Cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// holderNames collects "pod/rank" of every holder a lookup visits.
type holderNames struct {
	in    *kvindex.Interner
	names []string
}

func (h *holderNames) Visit(_ int, _ blockkeys.Key, hs []kvindex.Holder) bool {
	for _, x := range hs {
		name, rank := h.in.PodName(x.Pod)
		h.names = append(h.names, fmt.Sprintf("%s/%d", name, rank))
	}
	return true
}

// TestLeasesTakeoverTopicNamedPod: the endpoint has no pod= (its engine
// names the pod in the topic) and publishes two DP ranks. Daemon a owns it
// and dies (its Redis link is cut, so it can neither release nor clear);
// daemon b, which never saw the pod, takes the endpoint over after the
// lease TTL and must not serve what a indexed: the events between a's
// death and the takeover are lost. (The takeover this replaced cleared
// only configured pod names, so here it cleared nothing.)
func TestLeasesTakeoverTopicNamedPod(t *testing.T) {
	srv := redistest.Start(t)
	proxy := startCutProxy(t, srv.Addr())
	addr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pub := pypub.StartPublisher(t, addr, true)
	mutate := func(id, redisAddr string) func(*Config) {
		return func(c *Config) {
			c.Index, c.Leases, c.LeaseTTL, c.DaemonID, c.ZMQBind = "redis://"+redisAddr+"/0", true, Duration(1500*time.Millisecond), id, ""
			c.Endpoints = []EndpointSpec{{Address: addr, Model: e2eModel}}
		}
	}
	a := startInProcess(t, mutate("daemon-a", proxy.Addr()))
	pub.WaitReady(waitLimit)

	h, _ := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	tokens := make([]uint32, 3*e2eBlock)
	for i := range tokens {
		tokens[i] = uint32(i + 7)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	q := query{model: e2eModel, tokens: tokens}
	topic := "kv@eng-t@" + e2eModel
	seq := []uint64{0, 0}
	send := func(rank, blocks int) {
		pub.Send(pypub.Batch{Topic: topic, Seq: seq[rank], Form: "map", DPRank: pypub.Rank(rank),
			Events: []pypub.Event{stored(keys, tokens, 0, blocks, "")}})
		seq[rank]++
	}
	// The subscription may miss messages published before it is attached:
	// republish (idempotent) until both ranks are indexed.
	wait.Until(t, "a indexes both ranks of eng-t", func() string {
		send(0, 2)
		send(1, 3)
		hs, gs := a.scores(q)
		if hs == "eng-t=3[1:3 0:2]" && gs == hs {
			return ""
		}
		return "still " + hs + " / " + gs
	})
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	defer rc.Close()
	wait.Until(t, "a records eng-t as indexed from the endpoint", func() string {
		names, err := rc.SMembers(context.Background(), "kvindex:lease-pods:"+addr).Result()
		if err == nil && slices.Equal(names, []string{"eng-t"}) {
			return ""
		}
		return "still " + fmt.Sprint(names, err)
	})

	proxy.Cut()
	// Nothing a indexed was cleared: it could not reach Redis any more.
	b := startInProcess(t, mutate("daemon-b", srv.Addr()))
	wait.Until(t, "b takes the endpoint over", func() string {
		n, err := rc.Get(context.Background(), "kvindex:lease:"+addr).Result()
		if n == "daemon-b" {
			return ""
		}
		return "still " + fmt.Sprint(n, err)
	})
	// Read the shared index directly: b's API answers only for models b
	// has seen events of, and b has seen none yet.
	in := kvindex.NewInterner()
	reader, err := redisindex.New(context.Background(), redisindex.Config{URL: srv.URL(), Interner: in})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	wait.Until(t, "the shared index holds nothing a indexed", func() string {
		var v holderNames
		v.in = in
		err := reader.Lookup(context.Background(), in.Model(e2eModel), keys, &v)
		if err == nil && len(v.names) == 0 {
			return ""
		}
		return "still " + fmt.Sprint(v.names, err)
	})
	// The endpoint's new events reach the index through b.
	wait.Until(t, "events applied through b", func() string {
		send(1, 1)
		hs, gs := b.scores(q)
		if hs == "eng-t=1[1:1]" && gs == hs {
			return ""
		}
		return "still " + hs + " / " + gs
	})
	pub.Close()
}
