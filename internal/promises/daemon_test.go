package promises

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/e2e"
	"github.com/kvindex/kvindex/kvevents/event"

	"github.com/kvindex/kvindex/internal/enginepub"
	"github.com/kvindex/kvindex/internal/logtest"
)

// The daemon's defaults the scenarios rely on: vLLM's block size and hash
// algorithm and an unset --hash-seed (the empty PYTHONHASHSEED string), so
// the engine hashes the tests compute equal the daemon's keys without adding
// --hash-seed to the flags under test.
const (
	blockSize = 16
	model     = "org/model"
	waitLimit = 30 * time.Second
)

// bin is the kvindexd binary TestMain builds once for every scenario.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	// Most scenarios spend their time waiting for a daemon's timers (pod
	// expiry, read and idle timeouts), not on CPU: run more of them at once
	// than the default of GOMAXPROCS, unless -parallel was given.
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kvindexd-promises-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := e2e.FindRepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if bin, err = e2e.BuildDaemon(root, dir, buildFlags...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// daemon is one `kvindexd serve` process.
type daemon struct {
	t       testing.TB
	cmd     *exec.Cmd
	http    string // host:port
	grpc    string // host:port
	zmq     string // tcp://host:port ("" when --zmq-bind "" was given)
	logs    *logtest.Buffer
	exited  chan struct{}
	waitErr error
	token   string // sent as a bearer token by get/do when set
}

// startDaemon runs `kvindexd serve` with the default flags plus flags, on
// free loopback ports, and waits until /readyz answers. A port taken between
// freePort and the bind (parallel scenarios) is retried on new ports.
func startDaemon(t testing.TB, flags ...string) *daemon {
	t.Helper()
	for attempt := 0; ; attempt++ {
		d, err := tryStart(t, flags)
		if err == nil {
			return d
		}
		if attempt < 3 && strings.Contains(d.logs.String(), "address already in use") {
			continue
		}
		t.Fatalf("kvindexd serve %s: %v\n%s", strings.Join(flags, " "), err, d.logs.String())
	}
}

func tryStart(t testing.TB, flags []string) (*daemon, error) {
	d := &daemon{t: t, logs: &logtest.Buffer{}, exited: make(chan struct{})}
	d.http = fmt.Sprintf("127.0.0.1:%d", e2e.FreePort(t))
	d.grpc = fmt.Sprintf("127.0.0.1:%d", e2e.FreePort(t))
	args := []string{"serve", "--http-addr", d.http, "--grpc-addr", d.grpc}
	if !hasFlag(flags, "--zmq-bind") {
		d.zmq = fmt.Sprintf("tcp://127.0.0.1:%d", e2e.FreePort(t))
		args = append(args, "--zmq-bind", d.zmq)
	}
	args = append(args, flags...)
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = e2e.EnvWithoutKVIndex()
	d.cmd.Stderr = d.logs
	d.cmd.Stdout = d.logs
	if err := d.cmd.Start(); err != nil {
		return d, err
	}
	go func() { d.waitErr = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("kvindexd %s log (last 40 lines):\n%s", strings.Join(args, " "), lastLines(d.logs.String(), 40))
		}
	})
	if err := e2e.WaitReady(d.http, d.exited, waitLimit); err != nil {
		if errors.Is(err, e2e.ErrExitedBeforeReady) {
			return d, fmt.Errorf("%w: %v", err, d.waitErr)
		}
		d.kill()
		return d, err
	}
	return d, nil
}

func hasFlag(flags []string, name string) bool {
	for _, f := range flags {
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (d *daemon) kill() {
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// stop sends SIGTERM and waits for a clean exit (status 0).
func (d *daemon) stop() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	select {
	case <-d.exited:
		if d.waitErr != nil {
			d.t.Fatalf("exit after SIGTERM: %v", d.waitErr)
		}
	case <-time.After(waitLimit):
		d.t.Fatal("no exit within the wait limit after SIGTERM")
	}
}

// do sends one HTTP request (JSON body when body != "") with d.token.
func (d *daemon) do(method, path, body string) (int, string, http.Header) {
	d.t.Helper()
	req, err := http.NewRequest(method, "http://"+d.http+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (d *daemon) get(path string) (int, string) {
	d.t.Helper()
	code, body, _ := d.do("GET", path, "")
	return code, body
}

// metric sums the samples of series in /metrics: "name" sums every label
// set of name, `name{a="x",b="y"}` every label set holding those labels.
func (d *daemon) metric(series string) float64 {
	d.t.Helper()
	code, body := d.get("/metrics")
	if code != http.StatusOK {
		d.t.Fatalf("/metrics: %d %s", code, body)
	}
	return metricIn(body, series)
}

func metricIn(body, series string) float64 {
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
// (Label values in the scenarios hold no commas.)
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

// scores asks POST /v1/score and returns matched blocks per pod.
func (d *daemon) scores(req map[string]any) map[string]int {
	d.t.Helper()
	b, _ := json.Marshal(req)
	code, body, _ := d.do("POST", "/v1/score", string(b))
	if code != http.StatusOK {
		d.t.Fatalf("/v1/score %s: %d %s", b, code, body)
	}
	var out struct {
		Pods []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matched_blocks"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		d.t.Fatalf("/v1/score answer %q: %v", body, err)
	}
	m := map[string]int{}
	for _, p := range out.Pods {
		m[p.Pod] = p.MatchedBlocks
	}
	return m
}

func (d *daemon) scoreTokens(model string, tokens []uint32) map[string]int {
	d.t.Helper()
	return d.scores(map[string]any{"model": model, "token_ids": tokens})
}

// podInfo is the part of a /v1/pods row the scenarios read.
type podInfo struct {
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
}

func (d *daemon) pods() []podInfo {
	d.t.Helper()
	code, body := d.get("/v1/pods")
	if code != http.StatusOK {
		d.t.Fatalf("/v1/pods: %d %s", code, body)
	}
	var out struct {
		Pods []podInfo `json:"pods"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		d.t.Fatalf("/v1/pods answer: %v", err)
	}
	return out.Pods
}

func (d *daemon) pod(name string) (podInfo, bool) {
	d.t.Helper()
	for _, p := range d.pods() {
		if p.Pod == name {
			return p, true
		}
	}
	return podInfo{}, false
}

// publisher connects an engine's PUB socket to the daemon's bind address
// and waits for the daemon's subscription (ZeroMQ drops what a PUB sends
// before it: the slow joiner).
func (d *daemon) publisher() *enginepub.Publisher {
	d.t.Helper()
	p, err := enginepub.NewPublisher(d.zmq, false)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := p.WaitSubscribed(ctx, "kv@"); err != nil {
		d.t.Fatalf("no subscription from the daemon: %v", err)
	}
	return p
}

// publish sends one vLLM batch on topic kv@pod@model.
func publish(t testing.TB, p *enginepub.Publisher, pod, model string, seq uint64, b *event.Batch) {
	t.Helper()
	payload, err := enginepub.EncodeVLLMBatch(b, enginepub.VLLMEncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish("kv@"+pod+"@"+model, seq, payload); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// prompt is nBlocks blocks of token ids distinct for every distinct base.
func prompt(base, nBlocks int) []uint32 {
	toks := make([]uint32, nBlocks*blockSize)
	for i := range toks {
		toks[i] = uint32(base*100_000 + i + 1)
	}
	return toks
}

// engineHashes are the block hashes a vLLM engine with the daemon's default
// key settings sends for tokens.
func engineHashes(t testing.TB, tokens []uint32) []uint64 {
	t.Helper()
	h, err := blockkeys.NewHasher(blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	keys := h.Keys(nil, tokens, blockkeys.RequestExtras{})
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = uint64(k)
	}
	return out
}

// stored is a batch of one BlockStored event of tokens with hashes.
func stored(hashes []uint64, tokens []uint32) *event.Batch {
	return &event.Batch{Events: []event.Event{{Kind: event.BlockStored, BlockHashes: hashes,
		TokenIDs: tokens, BlockSize: blockSize}}}
}

// eventually polls check until it returns "" (the state the scenario waits
// for: events are applied asynchronously) and fails with its last answer
// after within.
func eventually(t testing.TB, within time.Duration, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// rawDial opens a TCP connection to a tcp://host:port or host:port address.
func rawDial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reports whether the peer closes c (EOF or reset) within d,
// reading and discarding whatever it sends first.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return true
}

// writeFile writes a file in t's temp dir and returns its path.
func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
