package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// Raw ZMTP 3.1 bytes, written from RFC 37 (the layout is independent of our
// transport): a NULL-mechanism greeting, commands and frame headers.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	copy(g[12:], "NULL")
	return g
}

// zmtpCommand frames a command body (name length, name, data).
func zmtpCommand(name string, data []byte) []byte {
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, data...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

func zmtpReadyPUB() []byte {
	var meta []byte
	meta = append(meta, 11)
	meta = append(meta, "Socket-Type"...)
	meta = binary.BigEndian.AppendUint32(meta, 3)
	meta = append(meta, "PUB"...)
	return zmtpCommand("READY", meta)
}

// zmtpLongHeader is a frame header (flags | LONG) declaring size bytes.
func zmtpLongHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// hostileStreams are the byte sequences that crashed the daemon through its
// previous ZMQ library, each sent on its own connection.
var hostileStreams = map[string][]byte{
	"command_2p50":         cat(zmtpGreeting(), zmtpLongHeader(0x04, 1<<50)),
	"command_2p62":         cat(zmtpGreeting(), zmtpLongHeader(0x04, 1<<62)),
	"ready_truncated_meta": cat(zmtpGreeting(), zmtpCommand("READY", []byte{11})),
	"message_2p50":         cat(zmtpGreeting(), zmtpReadyPUB(), zmtpLongHeader(0x00, 1<<50)),
	"message_2p62":         cat(zmtpGreeting(), zmtpReadyPUB(), zmtpLongHeader(0x01, 1<<62)),
}

// metric reads one sample of the daemon's /metrics ("" labels: the first).
func (e *e2eDaemon) metric(name string) float64 {
	e.t.Helper()
	code, body := e.get("/metrics")
	if code != http.StatusOK {
		e.t.Fatalf("/metrics: %d", code)
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			v, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			return v
		}
	}
	return 0
}

// realBatch publishes blocks of tokens for pod through a real libzmq
// publisher and waits until the daemon serves them.
func realBatch(t *testing.T, e *e2eDaemon, pub *pypub.Publisher, pod string) {
	t.Helper()
	h, _ := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, Seed: e2eSeed, BlockSize: e2eBlock})
	tokens := make([]uint32, 2*e2eBlock)
	for i := range tokens {
		tokens[i] = uint32(500 + i)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	pub.Send(pypub.Batch{Topic: "kv@" + pod + "@" + e2eModel, Seq: 0, Form: "map", DPRank: pypub.Rank(0),
		Events: []pypub.Event{stored(keys, tokens, 0, 2, "")}})
	e.expect("real publisher after hostile peers", query{model: e2eModel, tokens: tokens, pods: []string{pod}}, pod+"=2")
}

// Every crashing byte sequence of the old transport, sent to the daemon's
// bind port, plus one connection that never says anything: the daemon keeps
// serving, a real libzmq engine connecting afterwards gets its events
// through while the silent connection is still open, and each hostile
// connection is counted.
func TestHostileBindPeers(t *testing.T) {
	e := startInProcess(t, func(c *Config) { c.ZMQHandshakeTimeout = Duration(time.Minute) })
	addr := strings.TrimPrefix(e.bind, "tcp://")
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	for name, b := range hostileStreams {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s: daemon gone: %v", name, err)
		}
		_, _ = c.Write(b)
		// the daemon closes the connection; nothing else happens
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	if code, _ := e.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	pub := pypub.StartPublisher(t, e.bind, false)
	pub.WaitReady(waitLimit)
	realBatch(t, e, pub, "pod-real")
	// The silent connection is still open (its handshake deadline is a
	// minute away): the real engine did not wait for it.
	_ = idle.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := io.Copy(io.Discard, idle); !isTimeout(err) {
		t.Fatalf("silent connection ended before the real engine's batch was served: %v", err)
	}
	if v := e.metric("kvindexd_kvevents_zmq_oversized_total"); v < 4 {
		t.Errorf("oversized %v, want >= 4", v)
	}
	if v := e.metric("kvindexd_kvevents_zmq_protocol_errors_total"); v < 1 {
		t.Errorf("protocol errors %v, want >= 1", v)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hostileEngine is a TCP listener on loopback that answers every connection
// with a greeting, a READY of a PUB and a message frame header declaring
// 2^50 bytes.
func hostileEngine(t *testing.T) (addr string, conns func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := make(chan struct{}, 1000)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n <- struct{}{}
			go func() {
				defer c.Close()
				_, _ = c.Write(cat(zmtpGreeting(), zmtpReadyPUB(), zmtpLongHeader(0x00, 1<<50)))
				_ = c.SetReadDeadline(time.Now().Add(waitLimit))
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return "tcp://" + ln.Addr().String(), func() int { return len(n) }
}

// POST /v1/endpoints pointing at a hostile "engine": the daemon dials it,
// refuses what it sends, keeps redialling with backoff and keeps serving; a
// real engine added next gets its events through.
func TestHostileEngineEndpoint(t *testing.T) {
	e := startInProcess(t, func(c *Config) { c.AdminAPI = true })
	addr, conns := hostileEngine(t)
	if code, body := e.do("POST", "/v1/endpoints", `{"address":"`+addr+`","pod":"pod-hostile","model":"`+e2eModel+`"}`); code != http.StatusCreated {
		t.Fatalf("POST /v1/endpoints: %d %s", code, body)
	}
	wait.For(t, "the daemon dialling the hostile engine twice", func() bool { return conns() >= 2 })
	realAddr := fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t))
	pub := pypub.StartPublisher(t, realAddr, true)
	if code, body := e.do("POST", "/v1/endpoints", `{"address":"`+realAddr+`","pod":"pod-real","model":"`+e2eModel+`"}`); code != http.StatusCreated {
		t.Fatalf("POST /v1/endpoints: %d %s", code, body)
	}
	pub.WaitReady(waitLimit)
	realBatch(t, e, pub, "pod-real")
	if v := e.metric("kvindexd_kvevents_zmq_oversized_total"); v < 2 {
		t.Errorf("oversized %v, want >= 2", v)
	}
}

// A topic whose pod name is not UTF-8 used to make every later /metrics
// scrape answer 500. It is now dropped and counted; /metrics answers 200 and
// /v1/pods is valid JSON.
func TestInvalidUTF8PodName(t *testing.T) {
	e := startInProcess(t, nil)
	pub := pypub.StartPublisher(t, e.bind, false)
	pub.WaitReady(waitLimit)
	payload := func(seq byte) []string {
		var s8 [8]byte
		s8[7] = seq
		// [ts, [["AllBlocksCleared"]]]: a valid vLLM batch
		return []string{hex.EncodeToString([]byte("kv@pod-\xff\xfe@" + e2eModel)), hex.EncodeToString(s8[:]),
			"92cb000000000000000091" + "91b0" + hex.EncodeToString([]byte("AllBlocksCleared"))}
	}
	pub.SendJSON(map[string]any{"raw_frames": payload(0)})
	realBatch(t, e, pub, "pod-after") // ordered behind the hostile message
	if v := e.metric(`kvindexd_kvevents_dropped_frames_total{reason="pod_name_invalid_utf8"}`); v != 1 {
		t.Errorf("dropped{pod_name_invalid_utf8} = %v", v)
	}
	code, body := e.get("/v1/pods")
	if code != http.StatusOK || !json.Valid([]byte(body)) {
		t.Fatalf("/v1/pods: %d valid=%v", code, json.Valid([]byte(body)))
	}
	if strings.Contains(body, "pod-\\ufffd") || strings.Contains(body, "pod-\xff") {
		t.Fatalf("the invalid pod is listed: %s", body)
	}
}
