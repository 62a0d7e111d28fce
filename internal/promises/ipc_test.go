package promises

import (
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
)

// --zmq-bind ipc://path: the socket file has mode 0660 whatever the umask
// (as the HTTP and gRPC unix sockets), and after SIGKILL, which leaves the
// file behind, the daemon restarts on the same path (the stale file is
// replaced because nothing accepts on it). Before, the restart failed with
// "address already in use", a crash loop, and the mode followed the umask
// (0755 under the usual 022).
func TestPromiseZMQIPCBindRestart(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "kvz") // short: socket paths are limited to ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "events.sock")
	flags := []string{"--zmq-bind", "ipc://" + path}
	check := func(when string) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
			t.Fatalf("%s: %s: %v (mode %v), want a socket with mode 0660", when, path, err, fi.Mode())
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err != nil {
			t.Fatalf("%s: connecting to %s: %v", when, path, err)
		}
		defer c.Close()
		// The ZMTP greeting's signature starts with 0xFF.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 0xFF {
			t.Fatalf("%s: no ZMTP greeting on %s: %v %x", when, path, err, b)
		}
	}
	d := harness.Start(t, flags...)
	check("first start")
	d.Kill()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the killed daemon left no socket file, nothing to test: %v", err)
	}
	d2, err := harness.TryStart(t, harness.Config{Flags: flags})
	if err != nil {
		t.Fatalf("restart on the stale socket after SIGKILL: %v\n%s", err, d2.Logs.String())
	}
	check("after the restart")
	// A second daemon on the same path must not take the live socket over.
	if d3, err := harness.TryStart(t, harness.Config{Flags: flags}); err == nil {
		t.Fatalf("a second daemon bound the live socket %s:\n%s", path, d3.Logs.String())
	}
	check("after a second daemon tried the live path")
}
