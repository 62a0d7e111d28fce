package promises

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/kvindex/kvindex/kvevents/event"
)

// chattyPeers keeps n connections from ip to the bind socket, each sending
// an empty batch every period, re-dialling each one the daemon closes,
// until stop is closed.
func chattyPeers(t *testing.T, d *harness.Daemon, ip string, n int, period time.Duration, stop <-chan struct{}) (wait func()) {
	empty, err := enginepub.EncodeVLLMBatch(&event.Batch{}, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 2 * time.Second}
			topic := []byte(fmt.Sprintf("kv@chatty-%d@%s", i, model))
			for seq := uint64(0); ; {
				select {
				case <-stop:
					return
				default:
				}
				c, err := dl.Dial("tcp", strings.TrimPrefix(d.ZMQ, "tcp://"))
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				_, err = c.Write(append(zmtpGreeting(), zmtpReadyPUB()...))
				for err == nil {
					var sb [8]byte
					binary.BigEndian.PutUint64(sb[:], seq)
					seq++
					if _, err = c.Write(rawMessage(topic, sb[:], empty)); err != nil {
						break
					}
					select {
					case <-stop:
						c.Close()
						return
					case <-time.After(period):
					}
				}
				c.Close()
			}
		})
	}
	return wg.Wait
}

// --zmq-max-conns with chatty peers: connections from another loopback
// address, more than the slots, each sending an empty batch every 300 ms
// and re-dialled when closed, cannot lock engines out. An empty batch is
// not publishing: such a peer never earns the reserved slots (kept for
// hosts that published events), so an engine that reconnects gets in at
// once, and its connections are as evictable as silent ones, so a new
// engine from a new address gets in once they are --zmq-evict-idle-after
// old. Before, every empty batch counted as delivering: the peers held
// every slot, reserved ones included, for as long as they kept talking.
func TestPromiseZMQChattyPeersEvicted(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-max-conns", "16", "--zmq-evict-idle-after", "2s")
	pub := d.Publisher()
	storeAndWait(t, d, pub, "pod-known", model, 1, 1) // 127.0.0.1 published: known
	stop := make(chan struct{})
	waitChatty := chattyPeers(t, d, "127.0.0.2", 24, 300*time.Millisecond, stop)
	defer func() { close(stop); waitChatty() }()
	wait.Until(t, "the chatty peers at the cap", func() string {
		if v := d.Metric("kvindexd_kvevents_zmq_connections_rejected_total"); v < 5 {
			return fmt.Sprintf("rejected = %v", v)
		}
		return ""
	})
	state := func(when string) {
		t.Logf("%s: open %v, rejected %v, evicted %v", when, d.Metric("kvindexd_kvevents_zmq_open_connections"),
			d.Metric("kvindexd_kvevents_zmq_connections_rejected_total"), d.Metric("kvindexd_kvevents_zmq_connections_evicted_total"))
	}
	state("at the cap")
	// Another engine from the host that published (pod-known's stays
	// connected) takes a kept slot at once.
	start := time.Now()
	publishesAfter(t, d, "pod-back")
	t.Logf("the engine from a known host published after %v", time.Since(start))
	state("after it")

	// A new engine from a new address: once the chatty connections are
	// older than --zmq-evict-idle-after, it evicts one. It re-dials as
	// libzmq does (every 100 ms) while refused.
	time.Sleep(2 * time.Second)
	state("2 s later")
	toks := prompt(9, 1)
	payload, err := enginepub.EncodeVLLMBatch(stored(engineHashes(t, toks), toks), enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msg := rawMessage([]byte("kv@pod-new@"+model), make([]byte, 8), payload)
	start = time.Now()
	deadline := start.Add(15 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("a new engine was locked out for %v by chatty peers", time.Since(start))
		}
		c := rawPubFrom(t, d, "127.0.0.3")
		_, _ = c.Write(msg)
		if pollFor(time.Second, func() bool { return d.ScoreTokens(model, toks)["pod-new"] == 1 }) {
			break
		}
		c.Close()
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the new engine published %v after the chatty connections were 2 s old", time.Since(start))
	if v := d.Metric("kvindexd_kvevents_zmq_connections_evicted_total"); v < 1 {
		t.Errorf("connections_evicted_total = %v, want >= 1", v)
	}
}

// pollFor reports whether cond holds within limit.
func pollFor(limit time.Duration, cond func() bool) bool {
	for end := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
