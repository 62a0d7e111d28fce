package promises

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const scoreBody = `{"model":"org/model","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`

// --http-read-header-timeout: a client that has not sent its headers by the
// deadline loses the connection.
func TestPromiseHTTPReadHeaderTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-read-header-timeout", "1s")
	c := rawDial(t, d.HTTP)
	start := time.Now()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("headers that never finish kept the connection")
	}
	if el := time.Since(start); el < 900*time.Millisecond || el > 10*time.Second {
		t.Errorf("closed after %v, want about 1 s", el)
	}
}

// --http-read-timeout: a body that never finishes is cut off, and probes keep
// answering meanwhile.
func TestPromiseHTTPReadTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-read-timeout", "1s")
	c := rawDial(t, d.HTTP)
	start := time.Now()
	if _, err := fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(scoreBody), scoreBody[:10]); err != nil {
		t.Fatal(err)
	}
	if code, _ := d.Get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d while a body hangs", code)
	}
	if !closedWithin(c, wait.Limit) {
		t.Fatal("a body that never finishes kept the connection")
	}
	if el := time.Since(start); el < 900*time.Millisecond || el > 10*time.Second {
		t.Errorf("closed after %v, want about 1 s", el)
	}
}

// --http-write-timeout: an answer not written within the timeout (counted
// from the end of the request headers) is not sent; the connection closes.
func TestPromiseHTTPWriteTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-write-timeout", "1s")
	send := func(pause time.Duration) string {
		c := rawDial(t, d.HTTP)
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			len(scoreBody), scoreBody[:10]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
		if _, err := io.WriteString(c, scoreBody[10:]); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(wait.Limit))
		line, _ := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line)
	}
	if got := send(0); got != "HTTP/1.1 200 OK" {
		t.Fatalf("a prompt request: %q", got)
	}
	if got := send(1500 * time.Millisecond); got != "" {
		t.Errorf("an answer after the write timeout was sent: %q", got)
	}
}

// --http-idle-timeout: an idle keep-alive connection is closed.
func TestPromiseHTTPIdleTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-idle-timeout", "1s")
	c := rawDial(t, d.HTTP)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(wait.Limit))
	if _, err := r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("the idle connection was not closed: %v", err)
	}
	if el := time.Since(start); el < 900*time.Millisecond || el > 10*time.Second {
		t.Errorf("closed after %v idle, want about 1 s", el)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Request line and headers (default 65,536 bytes): larger is 431.
func TestPromiseHTTPMaxHeaderBytes(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	header := func(n int) int {
		req, _ := http.NewRequest("GET", "http://"+d.HTTP+"/healthz", nil)
		req.Header.Set("X-Pad", strings.Repeat("a", n))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := header(60 << 10); code != http.StatusOK {
		t.Errorf("60 KiB of headers: %d, want 200", code)
	}
	// net/http allows 4 KiB above the cap before it answers 431
	if code := header(64<<10 + 4<<10 + 1); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("over 68 KiB of headers: %d, want 431", code)
	}
}

// --http-max-body-bytes: a larger body is 413.
func TestPromiseHTTPMaxBodyBytes(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-max-body-bytes", "1024")
	if code, body, _ := d.Do("POST", "/v1/score", scoreBody); code != http.StatusOK {
		t.Fatalf("a small body: %d %s", code, body)
	}
	big := `{"model":"org/model","token_ids":[` + strings.Repeat("1,", 600) + `1]}`
	if code, body, _ := d.Do("POST", "/v1/score", big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 1.2 KB body: %d %s, want 413", code, body)
	}
}

// --http-max-conns: at the cap a new client is admitted by evicting a
// connection with no request in progress (never one inside a request);
// when every connection is inside a request it waits (in the kernel
// backlog) until one ends, then it is served; both counted.
func TestPromiseHTTPMaxConns(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-max-conns", "2")
	// Two requests in progress: headers sent, the body not finished.
	busy := func() net.Conn {
		c := rawDial(t, d.HTTP)
		if _, err := io.WriteString(c, "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// One at a time, each given 2 s to be parsed (inside its handler):
	// the harness's readiness poll left a keep-alive connection, so the
	// second busy client is admitted by evicting a connection without a
	// call, and a first one whose headers the server had not read yet
	// would be a stranger, evicted before that idle connection by design.
	held := []net.Conn{busy()}
	time.Sleep(2 * time.Second)
	held = append(held, busy())
	time.Sleep(2 * time.Second)
	waiting := rawDial(t, d.HTTP)
	if _, err := io.WriteString(waiting, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(waiting)
	_ = waiting.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := r.ReadByte(); !isTimeout(err) {
		t.Fatalf("the third connection was served at once while both were inside a request: %v", err)
	}
	held[0].Close()
	_ = waiting.SetReadDeadline(time.Now().Add(wait.Limit))
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the waiting client after a slot freed: %v", err)
	}
	resp.Body.Close()
	if v := d.Metric(`kvindexd_connections_limited_total{server="http"}`); v < 1 {
		t.Errorf(`kvindexd_connections_limited_total{server="http"} = %v, want >= 1`, v)
	}
	// waiting is now idle (keep-alive): a new client evicts it at once,
	// never held[1], which is still inside its request.
	c := rawDial(t, d.HTTP)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait.Limit))
	if resp, err = http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a new client with an idle connection at the cap: %v", err)
	}
	resp.Body.Close()
	if !closedWithin(waiting, wait.Limit) {
		t.Error("the idle connection was not evicted for the new client")
	}
	_ = held[1].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := held[1].Read(make([]byte, 1)); !isTimeout(err) {
		t.Errorf("the connection inside a request was touched: %v", err)
	}
	if v := d.Metric(`kvindexd_connections_evicted_total{server="http"}`); v < 1 {
		t.Errorf(`kvindexd_connections_evicted_total{server="http"} = %v, want >= 1`, v)
	}
}

// --grpc-max-conns: at the cap a connection that never made a call (here a
// raw TCP connection) gives way to a new client, which is served at once.
func TestPromiseGRPCMaxConns(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--grpc-max-conns", "1")
	held := rawDial(t, d.GRPC)
	if err := grpcHealthy(d.GRPC); err != nil {
		t.Fatalf("gRPC at the cap held by an idle connection: %v", err)
	}
	if !closedWithin(held, wait.Limit) {
		t.Error("the idle connection was not evicted")
	}
	if v := d.Metric(`kvindexd_connections_evicted_total{server="grpc"}`); v != 1 {
		t.Errorf(`kvindexd_connections_evicted_total{server="grpc"} = %v, want 1`, v)
	}
}

// --grpc-idle-timeout: connections that finish the HTTP/2 preface and
// SETTINGS and then idle (ignoring the GOAWAY and its PING) are closed, so
// they cannot hold every slot of --grpc-max-conns: a real client gets in.
func TestPromiseGRPCIdleTimeout(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--grpc-max-conns", "3", "--grpc-idle-timeout", "1s")
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c := rawDial(t, d.GRPC)
		// The client preface and an empty SETTINGS frame.
		if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	start := time.Now()
	for i, c := range held {
		if !closedWithin(c, wait.Limit) {
			t.Fatalf("idle connection %d was not closed", i)
		}
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("idle connections closed after %v, want about 1 s + the 5 s GOAWAY grace", el)
	}
	conn, err := grpc.NewClient(d.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("gRPC once the idle connections are gone: %v", err)
	}
}

// --http-header-budget-bytes: connections that each send ~60 KiB of small
// headers and then trickle their body hold their headers' bytes, counted
// from the moment they are read, before they are parsed. Large headers may
// take three quarters of the budget: the next such request is closed while
// its headers arrive, before net/http parses them (so its parsing costs no
// memory), while an ordinary request still fits in the last quarter.
func TestPromiseHTTPHeaderBudget(t *testing.T) {
	t.Parallel()
	d := harness.Start(t, "--http-header-budget-bytes", "200000")
	var pad strings.Builder
	for i := 0; pad.Len() < 60<<10; i++ {
		fmt.Fprintf(&pad, "X-Pad-%d: %s\r\n", i, strings.Repeat("a", 40))
	}
	slow := func() (net.Conn, *bufio.Reader) {
		c := rawDial(t, d.HTTP)
		req := "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n" + pad.String() + "\r\n{"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	for i := 0; i < 2; i++ { // 2 x 60 KiB: within 3/4 of the budget, held while the body trickles
		c, r := slow()
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := r.ReadByte(); !isTimeout(err) {
			t.Fatalf("slow request %d within the budget was answered: %v", i, err)
		}
	}
	c, r := slow()
	_ = c.SetReadDeadline(time.Now().Add(wait.Limit))
	if resp, err := http.ReadResponse(r, nil); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("the request over the header budget: %d, want the connection closed (or 503)", resp.StatusCode)
		}
	} else if isTimeout(err) {
		t.Fatal("the request over the header budget was held")
	}
	if code, body := d.Get("/healthz"); code != http.StatusOK {
		t.Fatalf("an ordinary request: %d %s", code, body)
	}
	if v := d.Metric("kvindexd_http_header_budget_rejected_total"); v != 1 {
		t.Errorf("kvindexd_http_header_budget_rejected_total = %v, want 1", v)
	}
}

// Numeric options have documented ranges (docs/configuration.md): the
// values that made the daemon panic, hang before binding or answer 431 to
// everything are start-up errors naming the option.
func TestPromiseFlagRanges(t *testing.T) {
	t.Parallel()
	for _, flags := range [][]string{
		{"--workers=9223372036854775807"},
		{"--queue-size=9223372036854775807"},
		{"--key-cache-size=9223372036854775807"},
		{"--digest-cache-size=9223372036854775807"},
		{"--http-max-header-bytes=9223372036854775807"},
		{"--index", "redis://127.0.0.1:1?pool_size=-5"},
		{"--index", "redis://127.0.0.1:1?pool_size=2000000000"},
		{"--index", "redis://127.0.0.1:1?call_timeout=2m"},
		{"--index", "redis-cluster://127.0.0.1:1?loss_check=10ms"},
		{"--pod-share=9223372036854775807"},
		{"--tier-weights", "gpu=NaN"},
		{"--tier-weights", "gpu=+Inf"},
		{"--tier-weights", "gpu=1e308"},
	} {
		d, err := harness.TryStart(t, harness.Config{Flags: flags})
		if err == nil {
			t.Errorf("%v: the daemon started", flags)
			continue
		}
		logs := d.Logs.String()
		// An exit, not a hang before binding: the daemon ended by itself.
		if !errors.Is(err, harness.ErrExitedBeforeReady) || !strings.Contains(logs, "out of range") || strings.Contains(logs, "panic") {
			t.Errorf("%v: %v, want an exit with an out-of-range error:\n%s", flags, err, harness.LastLines(logs, 5))
		}
	}
}
