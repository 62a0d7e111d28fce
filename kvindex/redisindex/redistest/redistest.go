// Package redistest starts throw-away redis-server processes (a single node or
// a Redis Cluster, with replicas if asked) on free loopback ports for tests in any package.
// It never connects to a server it did not start, and every process it starts
// is stopped and its temp directory removed by t.Cleanup.
//
// When redis-server is not installed the test is skipped with a loud message,
// unless the environment variable CI is set to a true value, in which case the
// test fails: CI must exercise the Redis backend.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
	// exited is closed when the current process has been reaped.
	exited chan struct{}
}

// Require returns the path of redis-server, skipping the test (or failing it
// under CI) when it is missing.
func Require(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		ci := strings.ToLower(os.Getenv("CI"))
		if ci != "" && ci != "0" && ci != "false" {
			t.Fatalf("redis-server not found in PATH and CI=%s: the Redis backend tests must run in CI (install redis-server/redis-tools)", os.Getenv("CI"))
		}
		msg := "!!! SKIPPING REDIS TESTS: redis-server not found in PATH (apt-get install -y redis-server redis-tools, or run hack/test-deps.sh; CI=true makes this a failure) !!!"
		// t.Skip alone is silent in go test's default output.
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	return bin
}

// FreePort asks the kernel for a free loopback TCP port. The port is released
// before return, so there is a small window where another process may take it;
// Start retries on a bind failure for that reason.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a persistence-free redis-server on a free loopback port. extra
// arguments are passed as config directives ("--cluster-enabled", "yes", ...).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Require(t)
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{t: t, bin: bin, dir: dir, port: FreePort(t), args: extra}
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: could not start redis-server: %v", lastErr)
	return nil
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the server's TCP port (stable across Kill/Restart).
func (s *Server) Port() int { return s.port }

// URL is a redis:// URL for db 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Dir is the server's working directory (cluster node files live there).
func (s *Server) Dir() string { return s.dir }

func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--loglevel", "warning",
	}
	args = append(args, s.args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.port)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// Wait until the server answers PING (or the process dies, e.g. port taken).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(s.Addr()) == nil {
			break
		}
		select {
		case <-exited:
			logf.Close()
			b, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("redis-server exited at start: %s", lastLines(string(b), 5))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			logf.Close()
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s", s.port)
		}
	}
	s.mu.Lock()
	s.cmd, s.log, s.exited = cmd, logf, exited
	s.mu.Unlock()
	return nil
}

// Kill stops the server abruptly (SIGKILL): no data is saved, clients see
// connection resets, exactly like a crashed Redis.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited, logf := s.cmd, s.exited, s.log
	s.cmd, s.log = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
	logf.Close()
}

// Restart starts the server again on the same port after Kill (or kills it
// first). It comes back empty, unless the test ran SAVE before the kill:
// then it loads that dump.rdb, i.e. comes back with old (possibly stale)
// data, like a Redis restored from a snapshot.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		// The port may linger briefly; nobody else should take it in between.
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart on port %d: %v", s.port, err)
}

// Stop kills the server; used by t.Cleanup.
func (s *Server) Stop() { s.Kill() }

// Do sends one command to the server using the RESP protocol and returns the
// raw reply line(s) as text. It is for test setup/inspection only (INFO,
// CONFIG SET, DBSIZE) and needs no client library.
func (s *Server) Do(args ...string) (string, error) {
	return do(s.Addr(), args...)
}

func ping(addr string) error {
	r, err := do(addr, "PING")
	if err != nil {
		return err
	}
	if r != "PONG" {
		return fmt.Errorf("PING: %q", r)
	}
	return nil
}

func do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// readReply renders a RESP2 reply as text: simple strings and bulk strings as
// is, integers in decimal, arrays as newline-joined elements.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func ioReadFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// InfoField returns one field of INFO <section> (e.g. "memory", "used_memory").
func (s *Server) InfoField(section, field string) (string, error) {
	info, err := s.Do("INFO", section)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}

// Cluster is a Redis Cluster started by a test.
type Cluster struct {
	// Nodes are every node, masters and replicas, in start order.
	Nodes []*Server
}

// ClusterOptions shape StartClusterWith's cluster.
type ClusterOptions struct {
	// Masters (>= 3) and Replicas per master (0 = none).
	Masters, Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master may not
	// answer before the others fail it over to a replica (0 = 2s).
	NodeTimeout time.Duration
	// Extra config directives passed to every node (as in Start).
	Extra []string
}

// StartCluster starts n (>=3) cluster-enabled redis-servers and joins them
// as masters without replicas; see StartClusterWith.
func StartCluster(t testing.TB, n int, extra ...string) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Masters: n, Extra: extra})
}

// StartClusterWith starts Masters*(1+Replicas) cluster-enabled
// redis-servers and joins them with `redis-cli --cluster create ...
// --cluster-replicas R --cluster-yes`, then waits until every node reports
// cluster_state:ok and every replica is in sync with its master (so a
// failover can promote it at once).
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	Require(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		ci := strings.ToLower(os.Getenv("CI"))
		if ci != "" && ci != "0" && ci != "false" {
			t.Fatalf("redis-cli not found in PATH and CI=%s", os.Getenv("CI"))
		}
		msg := "!!! SKIPPING REDIS CLUSTER TESTS: redis-cli not found in PATH (apt-get install -y redis-tools) !!!"
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	timeout := o.NodeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	c := &Cluster{}
	for i := 0; i < o.Masters*(1+o.Replicas); i++ {
		args := []string{"--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10)}
		c.Nodes = append(c.Nodes, Start(t, append(args, o.Extra...)...))
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		for {
			st, err := s.InfoClusterState()
			if err == nil && st == "ok" {
				if role, _ := s.InfoField("replication", "role"); role != "slave" {
					break
				}
				if link, _ := s.InfoField("replication", "master_link_status"); link == "up" {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ok (state %q, err %v)", s.Addr(), st, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Role is "master" or "slave" (INFO replication), "" when the node does
// not answer.
func (s *Server) Role() string {
	r, _ := s.InfoField("replication", "role")
	return r
}

// Pause stops the process with SIGSTOP: its sockets stay open and nothing
// answers, like a hung Redis. Resume (or the test's cleanup) continues it.
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP)
	s.t.Cleanup(s.Resume)
}

// Resume continues a paused server (SIGCONT); a no-op when it runs.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Errorf("redistest: %v to redis-server on port %d: %v", sig, s.port, err)
	}
}

// InfoClusterState is the cluster_state field of CLUSTER INFO.
func (s *Server) InfoClusterState() (string, error) {
	info, err := s.Do("CLUSTER", "INFO")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "cluster_state:"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no cluster_state")
}

// URL is a redis-cluster:// URL naming every node.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}
