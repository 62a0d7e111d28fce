package api

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// serveLimited serves the guarded handler with lim on a counted listener of
// at most maxConns connections.
func serveLimited(t *testing.T, cfg Config, lim HTTPLimits, maxConns int) (addr string, m *ConnMetrics) {
	t.Helper()
	g := newGuarded(t, cfg)
	m, err := NewConnMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := g.srv.NewHTTPServer(lim)
	go func() { _ = hs.Serve(LimitListener(ln, maxConns, "http", m)) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String(), m
}

func healthz(t *testing.T, addr string) {
	t.Helper()
	cl := &http.Client{Timeout: 20 * time.Second}
	resp, err := cl.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
}

// 200 clients send the headers of a score request and part of its body,
// then nothing: /healthz still answers, and every one of those connections
// is closed by the server after the read timeout. Without a read timeout
// they stayed open for ever.
func TestSlowBodiesAreCutOff(t *testing.T) {
	addr, m := serveLimited(t, Config{}, HTTPLimits{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second}, 1000)
	const n = 200
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"model\":\"m\",\"token_ids\":[1,2,")
	}
	open := m.open.WithLabelValues("http")
	// While the slow bodies are pending (the read timeout has not fired for
	// most of them yet), a probe is still served.
	healthz(t, addr)
	for i, c := range conns {
		// The server answers (an error for the unfinished body) and closes;
		// the client's own deadline only guards the test from hanging.
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("connection %d not closed by the server: %v", i, err)
		}
	}
	wait.For(t, "open connections back to zero", func() bool { return value(open) == 0 })
}

// At the connection limit a new client evicts the connection accepted
// longest ago that never had a request (counted), and is served at once;
// the other idle connections stay.
func TestConnectionLimitEvictsOldestIdle(t *testing.T) {
	addr, m := serveLimited(t, Config{}, HTTPLimits{ReadHeaderTimeout: 30 * time.Second}, 5)
	var idle []net.Conn
	for range 5 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
		wait.For(t, "connection open", func() bool { return value(m.open.WithLabelValues("http")) == float64(len(idle)) })
	}
	healthz(t, addr)
	if got := value(m.evicted.WithLabelValues("http")); got != 1 {
		t.Errorf("connections_evicted_total = %v, want 1", got)
	}
	if got := value(m.waited.WithLabelValues("http")); got != 0 {
		t.Errorf("connections_limited_total = %v, want 0 (an idle connection gave way)", got)
	}
	_ = idle[0].SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, idle[0]); err != nil {
		t.Errorf("the oldest idle connection was not evicted: %v", err)
	}
	for i, c := range idle[1:] {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d, newer than the evicted one, was touched: %v", i+1, err)
		}
	}
}

func TestBodyAndHeaderCaps(t *testing.T) {
	addr, _ := serveLimited(t, Config{MaxBodyBytes: 1000}, HTTPLimits{MaxHeaderBytes: 4096}, 0)
	post := func(body string, chunked bool) int {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if chunked {
			fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		} else {
			fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	big := `{"model":"m","token_ids":[` + strings.Repeat("1,", 1000) + `1]}`
	if code := post(big, false); code != http.StatusRequestEntityTooLarge {
		t.Errorf("body above the cap: %d, want 413", code)
	}
	if code := post(big, true); code != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body above the cap: %d, want 413", code)
	}
	if code := post(`{"model":"m","token_ids":[1,2,3,4]}`, false); code != http.StatusOK {
		t.Errorf("small body: %d", code)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 8192))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers above the cap: %d, want 431", resp.StatusCode)
	}
}

// value reads a gauge or counter.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return -1
	}
	if d.Gauge != nil {
		return d.GetGauge().GetValue()
	}
	return d.GetCounter().GetValue()
}
