// Package harness runs the real kvindexd binary for the end-to-end suites
// (internal/promises, internal/docexamples, internal/e2e, hack/demo): built once per
// test binary, started on free loopback ports with its default flags plus
// the test's own, and stopped with the test.
//
// It owns the daemon's process, its addresses and logs, the HTTP calls a
// scenario makes of it (/metrics, /v1/pods, /v1/score) and the rule that
// heavy tests never share the machine with each other (Heavy). It does not
// own waiting (package wait) or the engines' side of the wire (enginepub,
// pypub), and it never runs a daemon in-process: tests of the composition
// itself (cmd/kvindexd, client) build theirs from the packages they test.
package harness

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/race"
)

// ReadyLimit bounds the wait for a started daemon's /readyz: a hang guard
// generous enough for a race-built daemon on a loaded two-core machine.
const ReadyLimit = 2 * time.Minute

var (
	mainCalled bool
	plainBuild bool

	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// Option changes how Main builds the daemon.
type Option func()

// PlainBuild builds the daemon without -race even when the test binary has
// it: for suites that check what the daemon answers rather than its data
// races, and whose daemons would be too slow race-built (a tokenizer load
// takes over 20 s under the race detector).
func PlainBuild() Option { return func() { plainBuild = true } }

// Main runs m and removes the binary Start built. Every package that
// starts daemons calls it from its TestMain: os.Exit(harness.Main(m)).
//
// The daemon is built on the first Start, with -race when the test binary
// has it: under `go test -race` every package of kvindexd is then already
// in the build cache, so the build is a link, and a data race in the daemon
// is reported in its log and fails a test that stops it (exit status 66).
func Main(m *testing.M, opts ...Option) int {
	mainCalled = true
	for _, o := range opts {
		o()
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// Binary returns the path of the kvindexd built for this test binary,
// building it on the first call.
func Binary(t testing.TB) string {
	t.Helper()
	if !mainCalled {
		t.Fatal("harness: call os.Exit(harness.Main(m)) from the package's TestMain")
	}
	buildOnce.Do(func() {
		root, err := FindRepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if binDir, err = os.MkdirTemp("", "kvindexd-harness-"); err != nil {
			buildErr = err
			return
		}
		binPath, buildErr = BuildDaemon(root, binDir, BuildFlags()...)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// RepoRoot finds the module root from the test's working directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// FindRepoRoot is RepoRoot where there is no testing.TB.
func FindRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("harness: go.mod not found above %s", dir)
		}
		dir = parent
	}
}

// BuildFlags are the go build flags the daemon under test is built with:
// -race when the test binary has it (unless PlainBuild), so that under
// `go test -race` every package is already compiled and the build is a
// link, and a data race in the daemon fails the test (exit status 66).
func BuildFlags() []string {
	if race.Enabled && !plainBuild {
		return []string{"-race"}
	}
	return nil
}

// BuildDaemon builds ./cmd/kvindexd of the module at root into dir with the
// go build flags given and returns the binary's path. Start builds through
// it; a test that checks the build itself (version stamps) calls it too.
func BuildDaemon(root, dir string, flags ...string) (string, error) {
	bin := filepath.Join(dir, "kvindexd")
	build := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, "./cmd/kvindexd")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kvindexd: %v\n%s", err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// EnvWithoutKVIndex is the process environment without KVINDEX_* and OTEL_*
// variables: a daemon started with it runs on its defaults plus the flags it
// is given, untraced.
func EnvWithoutKVIndex() []string {
	var env []string
	for _, kv := range os.Environ() {
		// OTEL_*: a developer's tracing set-up must not make the
		// daemons under test export spans.
		if !strings.HasPrefix(kv, "KVINDEX_") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// ErrExitedBeforeReady is WaitReady's answer when the daemon's process ended.
var ErrExitedBeforeReady = errors.New("exited before ready")

// WaitReady polls http://addr/readyz until it answers 200, the daemon's
// process ends (exited is closed) or limit passes.
func WaitReady(addr string, exited <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-exited:
			return ErrExitedBeforeReady
		default:
		}
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heavy admits one heavy test of this test binary at a time; heavyLock
// then admits one of every test binary on the machine (`go test ./...` runs
// packages side by side).
var heavy = make(chan struct{}, 1)

// Heavy marks t as a heavy test (a daemon loading a tokenizer or moving
// hundreds of MiB, under the race detector): it waits until no other heavy
// test runs, in this test binary or another on the machine, and holds the
// heavy slot until t ends. Light tests still run beside it. Call it after
// t.Parallel(): a test that waited here before pausing for the parallel
// phase would hold up every test after it.
func Heavy(t testing.TB) {
	t.Helper()
	heavy <- struct{}{}
	release, err := heavyLock()
	if err != nil {
		<-heavy
		t.Fatalf("harness: the machine-wide heavy-test lock: %v", err)
	}
	t.Cleanup(func() { release(); <-heavy })
}
