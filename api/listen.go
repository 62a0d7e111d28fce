package api

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// UnixPrefix marks a listen address as a unix socket path:
// unix:///run/kvindex.sock (the form gRPC clients dial as well).
const UnixPrefix = "unix://"

// UnixSocketMode is the permission of a unix socket file the daemon
// creates: owner and group may connect (connecting needs write permission),
// nobody else. File permissions are the access control of a unix socket;
// the directory holding it restricts further.
const UnixSocketMode fs.FileMode = 0o660

// Listen opens a listen address: host:port on TCP, or unix:///path for a
// unix socket. A unix socket is created with UnixSocketMode; a stale socket
// file left by a process that died is removed first, while a socket that
// still accepts connections, or a path that is not a socket, is an error
// (never removed). Closing the listener removes the socket file.
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, UnixPrefix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if path == "" {
		return nil, fmt.Errorf("%q: want unix:///absolute/path", addr)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	// Make the socket no more permissive than UnixSocketMode from the moment
	// it exists: on Linux bind(2) creates the file with the socket inode's
	// mode (less the umask), which fchmod sets before the bind; the Chmod
	// below then sets the exact mode on every system.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = syscall.Fchmod(int(fd), uint32(UnixSocketMode)) }); cerr != nil {
			return cerr
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.EOPNOTSUPP) {
			return err
		}
		return nil
	}}
	ln, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, UnixSocketMode); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// removeStaleSocket removes path if it is a socket nobody listens on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: not removing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%s: another process is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: cannot tell whether the socket is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
