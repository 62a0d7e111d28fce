package promises

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
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

// Raw ZMTP 3.1 bytes written from RFC 37 (independent of the daemon's own
// transport): a NULL-mechanism greeting, commands and frame headers.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	copy(g[12:], "NULL")
	return g
}

func zmtpReadyPUB() []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, 3)
	body = append(body, "PUB"...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// zmtpLongHeader is a frame header (flags | LONG) declaring size bytes.
func zmtpLongHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

// rawPub is a TCP connection to the daemon's bind port that has sent a PUB's
// greeting and READY.
func rawPub(t *testing.T, d *harness.Daemon) net.Conn {
	t.Helper()
	c := rawDial(t, d.ZMQ)
	if _, err := c.Write(append(zmtpGreeting(), zmtpReadyPUB()...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// publishesAfter checks that a real publisher still gets a batch through.
func publishesAfter(t *testing.T, d *harness.Daemon, pod string) {
	t.Helper()
	storeAndWait(t, d, d.Publisher(), pod, model, 7, 2)
}

// --zmq-max-message-size: a frame declaring more than the cap closes its
// connection before anything is allocated; a message under it is applied.
func TestPromiseZMQMaxMessageSize(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-max-message-size", "1048576")
	pub := d.Publisher()
	// ~600 KB: 65,000 hashes of 9 bytes
	big := &event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: randomHashes(3, 65_000), BlockSize: blockSize}}}
	publish(t, pub, "pod-big", model, 0, big)
	wait.Until(t, "the message under the cap", func() string {
		if p, _ := d.Pod("pod-big"); p.Blocks != 65_000 {
			return fmt.Sprintf("pod-big holds %d blocks", p.Blocks)
		}
		return ""
	})
	c := rawPub(t, d)
	if _, err := c.Write(zmtpLongHeader(0x00, 1<<20+1)); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("a frame over the cap did not close its connection")
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_oversized_total", 1)
	publishesAfter(t, d, "pod-after")
}

// --zmq-handshake-timeout: a connection that has not finished its handshake
// by the deadline is closed, however it dribbles bytes.
func TestPromiseZMQHandshakeTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-handshake-timeout", "1s")
	c := rawDial(t, d.ZMQ)
	start := time.Now()
	for _, b := range zmtpGreeting()[:10] { // a byte every 200 ms
		if _, err := c.Write([]byte{b}); err != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("the dribbling connection was not closed")
	}
	if el := time.Since(start); el < 900*time.Millisecond || el > 10*time.Second {
		t.Errorf("closed after %v, want about 1 s", el)
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_handshake_timeouts_total", 1)
}

// --zmq-max-conns: at the cap a new connection is closed at once; once the
// held ones close, a publisher gets in again.
func TestPromiseZMQMaxConns(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-max-conns", "2")
	held := []net.Conn{rawDial(t, d.ZMQ), rawDial(t, d.ZMQ)}
	wait.Until(t, "two open connections", func() string {
		if v := d.Metric("kvindexd_kvevents_zmq_open_connections"); v != 2 {
			return fmt.Sprintf("zmq_open_connections = %v", v)
		}
		return ""
	})
	third := rawDial(t, d.ZMQ)
	if !closedWithin(third, 2*time.Second) {
		t.Fatal("the connection over the cap was not closed at once")
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_connections_rejected_total", 1)
	for _, c := range held {
		c.Close()
	}
	wait.Until(t, "the held connections closed", func() string {
		if v := d.Metric("kvindexd_kvevents_zmq_open_connections"); v != 0 {
			return fmt.Sprintf("zmq_open_connections = %v", v)
		}
		return ""
	})
	publishesAfter(t, d, "pod-after")
}

// Frames per message (fixed, 64): a 65th frame closes the connection.
func TestPromiseZMQFramesPerMessage(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	c := rawPub(t, d)
	var msg []byte
	for i := 0; i < 65; i++ {
		msg = append(msg, 0x01, 1, 'x') // MORE, short frame of 1 byte
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("65 frames did not close the connection")
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_oversized_total", 1)
	publishesAfter(t, d, "pod-after")
}

// Command frames (fixed, 16 KiB): a longer command closes the connection.
func TestPromiseZMQCommandSize(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	c := rawDial(t, d.ZMQ)
	if _, err := c.Write(append(zmtpGreeting(), zmtpLongHeader(0x04, 16<<10+1)...)); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("a command over 16 KiB did not close the connection")
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_oversized_total", 1)
}

// Bytes buffered by all connections of the bind socket (fixed, 256 MiB), of
// which messages over 1 MiB share three quarters: three connections each in
// the middle of a 60 MiB frame hold 180 MiB; a fourth growing past the
// share is closed, the three are not, and a publisher still gets through
// while they hold theirs. Only the budget may close a connection here: the
// --zmq-message-timeout default (10 s) would also close all four, unfinished
// on purpose, once writing 160 MiB to a race-built daemon on a loaded
// machine takes longer than that (and the fourth, closed by the timeout,
// would never be counted as a budget drop).
func TestPromiseZMQBufferBudget(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, "--zmq-message-timeout", "1h")
	const frame = 60 << 20
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c := rawPub(t, d)
		if _, err := c.Write(zmtpLongHeader(0x00, frame)); err != nil {
			t.Fatal(err)
		}
		for sent := 0; sent < 40<<20; sent += len(chunk) { // past half: the buffer holds all 60 MiB
			if _, err := c.Write(chunk); err != nil {
				break // the fourth is closed on the way
			}
		}
		held = append(held, c)
	}
	if !closedWithin(held[3], wait.Limit) {
		t.Fatal("the connection over the share of large messages was not closed")
	}
	for i, c := range held[:3] {
		if closedWithin(c, 100*time.Millisecond) {
			t.Errorf("connection %d within the budget was closed", i)
		}
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_buffer_budget_drops_total", 1)
	publishesAfter(t, d, "pod-after") // while the three hold their 180 MiB
}

// rawPubFrom is rawPub from another loopback address: a host the daemon
// has never heard from.
func rawPubFrom(t *testing.T, d *harness.Daemon, ip string) net.Conn {
	t.Helper()
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := dl.Dial("tcp", strings.TrimPrefix(d.ZMQ, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(append(zmtpGreeting(), zmtpReadyPUB()...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// rawMessage is a message of frames, each with a long header.
func rawMessage(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		more := byte(0)
		if i < len(frames)-1 {
			more = 0x01
		}
		out = append(out, zmtpLongHeader(more, uint64(len(f)))...)
		out = append(out, f...)
	}
	return out
}

// --zmq-message-timeout: a message whose first byte arrived must be whole
// within the timeout, or its connection is closed and its budget freed; the
// pods publishing on that connection may have lost that message, so they are
// listed incomplete ("message_lost") until their next batch shows the
// sequence is unbroken.
func TestPromiseZMQMessageTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-message-timeout", "1s")
	c := rawPub(t, d)
	toks := prompt(1, 2)
	payload, err := enginepub.EncodeVLLMBatch(stored(engineHashes(t, toks), toks), enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(rawMessage([]byte("kv@pod-a@"+model), binary.BigEndian.AppendUint64(nil, 0), payload)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "pod-a complete", func() string {
		if p, _ := d.Pod("pod-a"); p.Blocks != 2 || !p.Complete {
			return fmt.Sprintf("pod-a: %+v", p)
		}
		return ""
	})
	start := time.Now()
	if _, err := c.Write(append(zmtpLongHeader(0x01, 4<<20), make([]byte, 1<<20)...)); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("the stalled message's connection was not closed")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("closed after %v, want about 1 s", el)
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_message_timeouts_total", 1)
	waitMetric(t, d, "kvindexd_kvevents_zmq_messages_lost_total", 1)
	wait.Until(t, "pod-a incomplete", func() string {
		if p, _ := d.Pod("pod-a"); p.Complete || p.Reason != "message_lost" {
			return fmt.Sprintf("pod-a: %+v", p)
		}
		return ""
	})
	// Its next batch carries the next sequence number: the lost message was
	// not pod-a's, and it is complete again.
	publish(t, d.Publisher(), "pod-a", model, 1, stored(engineHashes(t, prompt(2, 1)), prompt(2, 1)))
	wait.Until(t, "pod-a complete again", func() string {
		if p, _ := d.Pod("pod-a"); !p.Complete || p.LastSeq != 1 {
			return fmt.Sprintf("pod-a: %+v", p)
		}
		return ""
	})
}

// --zmq-max-conns and --zmq-evict-idle-after: strangers (hosts that never
// delivered a message) cannot take the last 1/8 of the slots, and once the
// socket is full an engine gets in by evicting a peer idle past the bound.
func TestPromiseZMQIdleEviction(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--zmq-max-conns", "8", "--zmq-evict-idle-after", "3s")
	storeAndWait(t, d, d.Publisher(), "pod-known", model, 1, 1) // 127.0.0.1 has published: known
	var strangers []net.Conn
	for i := 0; i < 7; i++ { // with the engine: 8 of 8 slots
		strangers = append(strangers, rawPubFrom(t, d, "127.0.0.2"))
	}
	wait.Until(t, "eight open connections", func() string {
		if v := d.Metric("kvindexd_kvevents_zmq_handshakes_total"); v < 8 {
			return fmt.Sprintf("handshakes = %v", v)
		}
		return ""
	})
	if !closedWithin(rawPubFrom(t, d, "127.0.0.2"), 2*time.Second) {
		t.Fatal("a stranger over the cap, with no peer idle long enough, was not refused")
	}
	waitMetric(t, d, "kvindexd_kvevents_zmq_connections_rejected_total", 1)
	// After 3 s the strangers are idle past the bound: a new engine
	// connection evicts one rather than being refused.
	time.Sleep(3 * time.Second)
	publishesAfter(t, d, "pod-new")
	if v := d.Metric("kvindexd_kvevents_zmq_connections_evicted_total"); v < 1 {
		t.Errorf("connections_evicted_total = %v, want >= 1", v)
	}
	// The counter says a peer was evicted; which one is the daemon's choice,
	// and a loaded machine may deliver its close late: wait to see it.
	wait.For(t, "a stranger's connection closed by the eviction", func() bool {
		for _, c := range strangers {
			if closedWithin(c, 10*time.Millisecond) {
				return true
			}
		}
		return false
	})
}

// Writes (fixed, 10 s): a peer that sends PINGs and never reads fills the
// TCP buffers with the daemon's PONGs; the write that then blocks is cut off
// after 10 s and the connection closed.
func TestPromiseZMQWriteTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	c := rawPub(t, d)
	ping := []byte{0x04, 23, 4, 'P', 'I', 'N', 'G', 0, 0}
	ping = append(ping, bytes.Repeat([]byte{'c'}, 16)...) // a 16-byte context, echoed in each PONG
	burst := bytes.Repeat(ping, 4096)
	// Flood until the daemon has read nothing for 3 s in a row: its PONG
	// write blocks. (A write that times out while bytes still go through
	// is only a daemon slow to read, on a loaded machine, and is not a
	// stall: it would then answer every PING and never block.) A partial
	// write is finished first, so the PINGs stay whole.
	var stalled time.Time
	for off, idle := 0, 0; idle < 3; {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := c.Write(burst[off:])
		off = (off + n) % len(burst)
		switch {
		case err != nil && !isTimeout(err):
			t.Fatalf("write: %v", err)
		case n > 0:
			stalled, idle = time.Time{}, 0
		default:
			if stalled.IsZero() {
				stalled = time.Now().Add(-time.Second) // the second this attempt waited
			}
			idle++
		}
	}
	wait.Until(t, "the blocked connection closed", func() string {
		if v := d.Metric("kvindexd_kvevents_zmq_open_connections"); v != 0 {
			return fmt.Sprintf("zmq_open_connections = %v", v)
		}
		return ""
	})
	if el := time.Since(stalled); el < 7*time.Second {
		t.Errorf("closed %v after the daemon stopped reading, before the 10 s write timeout", el)
	}
}

// Redialling a dialled endpoint (--endpoint): an "engine" that completes the
// handshake and then sends a frame over the size cap is not redialled every
// 100 ms: the backoff keeps growing while connections end within 10 s, and
// the reason each ended is logged, rate-limited.
func TestPromiseZMQRedialBackoff(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var dials []time.Time
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			dials = append(dials, time.Now())
			mu.Unlock()
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Write(append(zmtpGreeting(), zmtpReadyPUB()...)); err != nil {
					return
				}
				var in [64 + 2]byte // the daemon's greeting and its READY's header
				if _, err := io.ReadFull(c, in[:]); err != nil {
					return
				}
				if _, err := io.ReadFull(c, make([]byte, in[65])); err != nil {
					return
				}
				_, _ = c.Write(zmtpLongHeader(0, 1<<40))
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	d := harness.Start(t, "--endpoint", "tcp://"+ln.Addr().String()+",pod=pod-hostile")
	time.Sleep(4 * time.Second)
	mu.Lock()
	n := len(dials)
	mu.Unlock()
	// Backoff 0.1, 0.2, 0.4, 0.8, 1.6 s...: about 6 dials in 4 s; every
	// 100 ms would be about 40.
	if n > 10 || n < 2 {
		t.Errorf("%d dials in 4 s, want the backoff's ~6", n)
	}
	logs := d.Logs.String()
	if !strings.Contains(logs, "engine publisher went away") || !strings.Contains(logs, "exceeds the size limit") {
		t.Errorf("the reason the connection ended is not logged:\n%s", harness.LastLines(logs, 20))
	}
	if c := strings.Count(logs, "engine publisher went away"); c > 6 {
		t.Errorf("%d 'went away' lines for %d dials: not rate-limited", c, n)
	}
}
