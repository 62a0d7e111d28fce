package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/enginepub"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
)

// StopLimit bounds the wait for a clean exit after SIGTERM (a hang guard).
const StopLimit = time.Minute

// Daemon is one `kvindexd serve` process. Its methods fail the test that
// started it.
type Daemon struct {
	HTTP string // host:port
	GRPC string // host:port
	// ZMQ is the bind address, tcp://host:port; "" when the flags set
	// --zmq-bind themselves.
	ZMQ  string
	Logs *logtest.Buffer // stdout and stderr
	// Token, when set, is sent as a bearer token by Do and the calls
	// built on it.
	Token string
	Args  []string // after the binary's path

	t       testing.TB
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Config is what StartConfig needs beyond the flags.
type Config struct {
	Flags []string
	// Dir is the daemon's working directory; "" is the test's.
	Dir string
	// Env is added to the daemon's environment (which holds no KVINDEX_*
	// or OTEL_* variable of the test's own: EnvWithoutKVIndex).
	Env []string
	// Cleanup registers the daemon's end; nil is t.Cleanup. Subtests that
	// share one daemon pass their parent's.
	Cleanup func(func())
}

// Start runs `kvindexd serve` with its default flags plus flags, on free
// loopback ports (unless flags set an address themselves), and waits until
// /readyz answers. The daemon is killed when t ends; its last log lines are
// in t's failure.
func Start(t testing.TB, flags ...string) *Daemon {
	t.Helper()
	return StartConfig(t, Config{Flags: flags})
}

// StartConfig is Start with a Config. A port taken between FreePort and the
// bind (parallel tests) is retried on new ports.
func StartConfig(t testing.TB, c Config) *Daemon {
	t.Helper()
	bin := Binary(t)
	if c.Cleanup == nil {
		c.Cleanup = t.Cleanup
	}
	for attempt := 0; ; attempt++ {
		d, err := tryStart(t, bin, c)
		if err == nil {
			return d
		}
		if attempt < 3 && strings.Contains(d.Logs.String(), "address already in use") {
			continue
		}
		t.Fatalf("kvindexd %s: %v\n%s", strings.Join(d.Args, " "), err, d.Logs.String())
	}
}

// TryStart starts the daemon once and returns the error of a daemon that
// exits before it is ready (ErrExitedBeforeReady, with its status) or is
// not ready within ReadyLimit, with the daemon, whose Logs say why: for
// tests of start-up errors.
func TryStart(t testing.TB, c Config) (*Daemon, error) {
	t.Helper()
	if c.Cleanup == nil {
		c.Cleanup = t.Cleanup
	}
	return tryStart(t, Binary(t), c)
}

func tryStart(t testing.TB, bin string, c Config) (*Daemon, error) {
	d := &Daemon{t: t, Logs: &logtest.Buffer{}, exited: make(chan struct{})}
	d.Args = append([]string{"serve"}, c.Flags...)
	if !hasFlag(c.Flags, "--http-addr") {
		d.HTTP = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
		d.Args = append(d.Args, "--http-addr", d.HTTP)
	}
	if !hasFlag(c.Flags, "--grpc-addr") {
		d.GRPC = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
		d.Args = append(d.Args, "--grpc-addr", d.GRPC)
	}
	if !hasFlag(c.Flags, "--zmq-bind") {
		d.ZMQ = fmt.Sprintf("tcp://127.0.0.1:%d", FreePort(t))
		d.Args = append(d.Args, "--zmq-bind", d.ZMQ)
	}
	d.cmd = exec.Command(bin, d.Args...)
	d.cmd.Dir = c.Dir
	d.cmd.Env = append(EnvWithoutKVIndex(), c.Env...)
	d.cmd.Stdout, d.cmd.Stderr = d.Logs, d.Logs
	if err := d.cmd.Start(); err != nil {
		return d, err
	}
	go func() { d.waitErr = d.cmd.Wait(); close(d.exited) }()
	c.Cleanup(func() {
		d.Kill()
		if t.Failed() {
			t.Logf("kvindexd %s log (last 40 lines):\n%s", strings.Join(d.Args, " "), LastLines(d.Logs.String(), 40))
		}
	})
	if err := WaitReady(d.HTTP, d.exited, ReadyLimit); err != nil {
		if errors.Is(err, ErrExitedBeforeReady) {
			return d, fmt.Errorf("%w: %v", err, d.waitErr)
		}
		d.Kill()
		return d, err
	}
	// /readyz may have been answered by another test's daemon that took the
	// port between FreePort and this one's bind (ours then exits with
	// "address already in use" and StartConfig retries): this daemon is up
	// once its own log says so. A daemon logging below info is taken at
	// /readyz's word.
	if !hasFlag(c.Flags, "--log-level") {
		if err := waitOwnLog(d, "kvindexd running", ReadyLimit); err != nil {
			return d, err
		}
	}
	return d, nil
}

// waitOwnLog waits until d's log holds line, d exits or limit passes.
func waitOwnLog(d *Daemon, line string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !strings.Contains(d.Logs.String(), line) {
		select {
		case <-d.exited:
			return fmt.Errorf("%w: %v", ErrExitedBeforeReady, d.waitErr)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Kill()
			return fmt.Errorf("kvindexd answered /readyz but did not log %q within %v", line, limit)
		}
	}
	return nil
}

func hasFlag(flags []string, name string) bool {
	for _, f := range flags {
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}

// LastLines is the last n lines of s, for a failure message.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Kill ends the process at once (SIGKILL) and waits for it.
func (d *Daemon) Kill() {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// Stop sends SIGTERM and waits for a clean exit (status 0).
func (d *Daemon) Stop() {
	d.t.Helper()
	d.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.waitErr != nil {
			d.t.Fatalf("exit after SIGTERM: %v", d.waitErr)
		}
	case <-time.After(StopLimit):
		d.t.Fatalf("no exit within %v after SIGTERM", StopLimit)
	}
}

// Signal sends sig to the process.
func (d *Daemon) Signal(sig os.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
}

// PID is the process id.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Exited is closed when the process has ended; ExitErr is then its status.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// ExitErr is the process' exit status once Exited is closed.
func (d *Daemon) ExitErr() error {
	<-d.exited
	return d.waitErr
}

// PeakRSS is the process' peak resident set (VmHWM), 0 where /proc is not there.
func (d *Daemon) PeakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.PID()))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Do sends one HTTP request (JSON body when body != "") with d.Token.
func (d *Daemon) Do(method, path, body string) (int, string, http.Header) {
	d.t.Helper()
	req, err := http.NewRequest(method, "http://"+d.HTTP+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if d.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// Get is Do of a GET without its headers.
func (d *Daemon) Get(path string) (int, string) {
	d.t.Helper()
	code, body, _ := d.Do("GET", path, "")
	return code, body
}

// Metric sums the samples of series in /metrics: "name" sums every label
// set of name, `name{a="x",b="y"}` every label set holding those labels.
func (d *Daemon) Metric(series string) float64 {
	d.t.Helper()
	code, body := d.Get("/metrics")
	if code != http.StatusOK {
		d.t.Fatalf("/metrics: %d %s", code, body)
	}
	return MetricIn(body, series)
}

// MetricsBody is /metrics, "" on any error: for a helper goroutine, which
// must not fail the test, and for daemons shared by subtests.
func (d *Daemon) MetricsBody() string {
	resp, err := http.Get("http://" + d.HTTP + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// MetricIn is Metric over a /metrics body.
func MetricIn(body, series string) float64 {
	name, want, _ := strings.Cut(strings.TrimSuffix(series, "}"), "{")
	sum := 0.0
	for _, l := range strings.Split(body, "\n") {
		sp := strings.LastIndexByte(l, ' ')
		if strings.HasPrefix(l, "#") || sp < 0 {
			continue
		}
		n, labels, _ := strings.Cut(strings.TrimSuffix(l[:sp], "}"), "{")
		if n != name || !hasLabels(labels, want) {
			continue
		}
		if v, err := strconv.ParseFloat(l[sp+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// hasLabels: every comma-separated label="value" of want is in labels.
// (Label values the tests ask for hold no commas.)
func hasLabels(labels, want string) bool {
	if want == "" {
		return true
	}
	have := map[string]bool{}
	for _, l := range strings.Split(labels, ",") {
		have[l] = true
	}
	for _, w := range strings.Split(want, ",") {
		if !have[w] {
			return false
		}
	}
	return true
}

// Scores asks POST /v1/score and returns matched blocks per pod.
func (d *Daemon) Scores(req map[string]any) map[string]int {
	d.t.Helper()
	m, err := d.TryScores(req)
	if err != nil {
		d.t.Fatal(err)
	}
	return m
}

// TryScores is Scores that returns an answer other than 200 as an error,
// for a wait.Until that outlasts a backend's failure.
func (d *Daemon) TryScores(req map[string]any) (map[string]int, error) {
	d.t.Helper()
	b, _ := json.Marshal(req)
	code, body, _ := d.Do("POST", "/v1/score", string(b))
	if code != http.StatusOK {
		return nil, fmt.Errorf("/v1/score %s: %d %s", b, code, body)
	}
	var out struct {
		Pods []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matched_blocks"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		return nil, fmt.Errorf("/v1/score answer %q: %v", body, err)
	}
	m := map[string]int{}
	for _, p := range out.Pods {
		m[p.Pod] = p.MatchedBlocks
	}
	return m, nil
}

// ScoreTokens is Scores of token ids.
func (d *Daemon) ScoreTokens(model string, tokens []uint32) map[string]int {
	d.t.Helper()
	return d.Scores(map[string]any{"model": model, "token_ids": tokens})
}

// PodInfo is the part of a /v1/pods row the tests read.
type PodInfo struct {
	Pod           string  `json:"pod"`
	DPRank        int     `json:"dp_rank"`
	Model         string  `json:"model"`
	Blocks        int64   `json:"blocks"`
	EventsApplied uint64  `json:"events_applied"`
	LastSeq       uint64  `json:"last_seq"`
	Stale         bool    `json:"stale"`
	Complete      bool    `json:"complete"`
	Reason        string  `json:"incomplete_reason"`
	Overflows     uint64  `json:"overflows"`
	ApplyLag      float64 `json:"apply_lag_seconds"`
	Role          string  `json:"role"`
}

// Pods is GET /v1/pods.
func (d *Daemon) Pods() []PodInfo {
	d.t.Helper()
	code, body := d.Get("/v1/pods")
	if code != http.StatusOK {
		d.t.Fatalf("/v1/pods: %d %s", code, body)
	}
	var out struct {
		Pods []PodInfo `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		d.t.Fatalf("/v1/pods answer: %v", err)
	}
	return out.Pods
}

// Pod is the /v1/pods row of name, if listed.
func (d *Daemon) Pod(name string) (PodInfo, bool) {
	d.t.Helper()
	for _, p := range d.Pods() {
		if p.Pod == name {
			return p, true
		}
	}
	return PodInfo{}, false
}

// Publisher connects an engine's PUB socket to the daemon's bind address
// and waits for the daemon's subscription (ZeroMQ drops what a PUB sends
// before it: the slow joiner).
func (d *Daemon) Publisher() *enginepub.Publisher {
	d.t.Helper()
	p, err := enginepub.NewPublisher(d.ZMQ, false)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), ReadyLimit)
	defer cancel()
	if err := p.WaitSubscribed(ctx, "kv@"); err != nil {
		d.t.Fatalf("no subscription from the daemon: %v", err)
	}
	return p
}
