package api

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sockPath is a socket path in a fresh temp dir (short: unix socket paths
// are limited to ~108 bytes).
func sockPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "k.sock")
}

func TestListenUnixModeAndCleanup(t *testing.T) {
	// A permissive umask must not widen the socket's mode.
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	p := sockPath(t)
	ln, err := Listen(UnixPrefix + p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != UnixSocketMode {
		t.Fatalf("socket mode %v, want socket %v", fi.Mode(), UnixSocketMode)
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("x"))
			_ = c.Close()
		}
	}()
	c, err := net.Dial("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
	_ = c.Close()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file after Close: %v", err)
	}
}

func TestListenUnixRemovesStaleSocket(t *testing.T) {
	p := sockPath(t)
	// A socket file nobody listens on, as a killed process leaves it.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	ln, err := Listen(UnixPrefix + p)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	_ = ln.Close()
}

func TestListenUnixRefusesLiveSocketAndOtherFiles(t *testing.T) {
	p := sockPath(t)
	live, err := Listen(UnixPrefix + p)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := Listen(UnixPrefix + p); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("live socket removed: %v", err)
	}

	f := sockPath(t)
	if err := os.WriteFile(f, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(UnixPrefix + f); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen over a regular file: %v", err)
	}
	if b, err := os.ReadFile(f); err != nil || string(b) != "data" {
		t.Fatalf("regular file touched: %q, %v", b, err)
	}
	if _, err := Listen(UnixPrefix); err == nil {
		t.Fatal("empty unix path accepted")
	}
}

func TestListenTCP(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ln.Addr().Network() != "tcp" {
		t.Fatalf("network %s", ln.Addr().Network())
	}
}
