// Package pypub drives hack/kvpublisher.py, the real-libzmq (pyzmq)
// publisher of vLLM, SGLang and TensorRT-LLM KV events, so the daemon and
// kvevents are tested against a ZeroMQ implementation we did not write. It
// does not own the pure-Go publisher (enginepub) or the daemon (harness).
package pypub

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
)

// Python is the interpreter with Debian's python3-zmq and python3-msgpack.
const Python = "/usr/bin/python3"

// RequirePython fails the test with the install command when the publisher's
// Python modules are missing (CI installs them: these tests never skip).
func RequirePython(t testing.TB) {
	t.Helper()
	out, err := exec.Command(Python, "-c", "import zmq, msgpack").CombinedOutput()
	if err != nil {
		t.Fatalf("e2e: %s cannot import zmq and msgpack (apt-get install -y python3-zmq python3-msgpack): %v\n%s", Python, err, out)
	}
}

// Event is one event line for kvpublisher.py (nil fields are omitted, which
// the script turns into absent/None fields as vLLM's encoder does).
type Event struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes,omitempty"`
	// SignedHashes are sent instead of BlockHashes when set (SGLang's
	// signed int64 hashes).
	SignedHashes []int64  `json:"-"`
	ParentHash   *uint64  `json:"parent_block_hash,omitempty"`
	TokenIDs     []uint32 `json:"token_ids,omitempty"`
	BlockSize    int      `json:"block_size,omitempty"`
	Medium       string   `json:"medium,omitempty"`
	LoraName     string   `json:"lora_name,omitempty"`
	CacheSalt    string   `json:"cache_salt,omitempty"`
	// SessionID, Ownership and ExtraFields (map form): vLLM's optional
	// BlockStored.session_id and ownership, and keys kvindex does not know.
	SessionID   string         `json:"session_id,omitempty"`
	Ownership   string         `json:"ownership,omitempty"`
	ExtraFields map[string]any `json:"extra_fields,omitempty"`
	// HashTokens (form "sglang"): the script computes SGLang's page hashes
	// from TokenIDs with hashlib and sends one event per page, as SGLang does.
	HashTokens bool `json:"hash_tokens,omitempty"`
}

// MarshalJSON writes signed hashes when the event carries them.
func (e Event) MarshalJSON() ([]byte, error) {
	type plain Event
	if e.SignedHashes == nil {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		plain
		BlockHashes []int64 `json:"block_hashes"`
	}{plain(e), e.SignedHashes})
}

// Batch is one published message.
type Batch struct {
	Topic       string  `json:"topic"`
	Seq         uint64  `json:"seq"`
	Form        string  `json:"form"` // array | map | sglang | trtllm | llmd-storage
	BytesHashes bool    `json:"bytes_hashes,omitempty"`
	DPRank      *int    `json:"dp_rank"`
	Events      []Event `json:"events"`
}

// Rank returns a pointer for Batch.DPRank.
func Rank(r int) *int { return &r }

// Publisher is one running kvpublisher.py process.
type Publisher struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *logtest.Buffer
	mu     sync.Mutex
	closed bool
}

// StartPublisher runs kvpublisher.py; bind=true binds endpoint (the daemon
// connects), bind=false connects to the daemon's bind socket.
func StartPublisher(t testing.TB, endpoint string, bind bool) *Publisher {
	t.Helper()
	mode := "connect"
	if bind {
		mode = "bind"
	}
	return StartPublisherArgs(t, "--endpoint", endpoint, "--mode", mode)
}

// StartPublisherArgs runs kvpublisher.py with the given arguments (see its
// usage: --replay-endpoint, --replay-legacy, ...).
func StartPublisherArgs(t testing.TB, args ...string) *Publisher {
	t.Helper()
	RequirePython(t)
	cmd := exec.Command(Python, append([]string{filepath.Join(harness.RepoRoot(t), "hack", "kvpublisher.py")}, args...)...)
	p := &Publisher{t: t, cmd: cmd, lines: make(chan string, 16)}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stderr = &logtest.Buffer{}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- strings.TrimSpace(sc.Text())
		}
		close(p.lines)
	}()
	t.Cleanup(p.kill)
	return p
}

// WaitReady waits for "ready": a subscriber is attached, so nothing sent
// afterwards is lost to ZeroMQ's slow-joiner window.
func (p *Publisher) WaitReady(timeout time.Duration) {
	p.t.Helper()
	p.expect("ready", timeout)
}

func (p *Publisher) expect(word string, timeout time.Duration) {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok || l != word {
			p.t.Fatalf("kvpublisher.py: want %q, got %q (exited: %v); stderr:\n%s", word, l, !ok, p.stderr.String())
		}
	case <-time.After(timeout):
		p.t.Fatalf("kvpublisher.py: no %q within %s; stderr:\n%s", word, timeout, p.stderr.String())
	}
}

// Send publishes one batch.
func (p *Publisher) Send(b Batch) {
	p.t.Helper()
	p.SendJSON(b)
}

// SendJSON writes one action line of any shape kvpublisher.py reads (raw
// frames, replay-only batches, fields Batch does not model).
func (p *Publisher) SendJSON(v any) {
	p.t.Helper()
	line, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("kvpublisher.py stdin: %v; stderr:\n%s", err, p.stderr.String())
	}
}

// Close ends the input, waits for "done" and the process' exit. If "done"
// never comes the test fails and the cleanup kills the process.
func (p *Publisher) Close() {
	p.t.Helper()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return
	}
	_ = p.stdin.Close()
	p.expect("done", 30*time.Second)
	err := p.cmd.Wait()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if err != nil {
		p.t.Fatalf("kvpublisher.py exited: %v; stderr:\n%s", err, p.stderr.String())
	}
}

// Kill ends the process with SIGKILL, as an engine that dies without
// closing its sockets (the kernel closes them: the peer sees the TCP
// connection end), and waits for it.
func (p *Publisher) Kill() { p.kill() }

func (p *Publisher) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	_ = p.stdin.Close()
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// String names the publisher in failures.
func (p *Publisher) String() string { return fmt.Sprintf("kvpublisher.py %v", p.cmd.Args[2:]) }
