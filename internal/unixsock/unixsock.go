// Package unixsock opens the unix sockets the daemon listens on (the HTTP
// and gRPC addresses, and the ZMQ bind's ipc:// endpoint) the one way: with
// an exact file mode from the moment the file exists, and replacing a stale
// socket file left by a process that died (SIGKILL, OOM kill), so a restart
// never fails with "address already in use".
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"
)

// Mode is the permission of the sockets the daemon creates: owner and group
// may connect (connecting needs write permission), nobody else. File
// permissions are the access control of a unix socket; the directory
// holding it restricts further.
const Mode fs.FileMode = 0o660

// Listen listens on the unix socket path with mode. A stale socket file
// (nothing accepts on it) is removed first, while a socket that still
// accepts connections, or a path that is not a socket, is an error (never
// removed). Closing the listener removes the socket file.
func Listen(path string, mode fs.FileMode) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("empty unix socket path")
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// Make the socket no more permissive than mode from the moment it
	// exists: on Linux bind(2) creates the file with the socket inode's mode
	// (less the umask), which fchmod sets before the bind; the Chmod below
	// then sets the exact mode on every system.
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = syscall.Fchmod(int(fd), uint32(mode)) }); cerr != nil {
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
	if err := os.Chmod(path, mode); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// removeStale removes path if it is a socket nobody listens on: it tries to
// connect first, so a live daemon's socket is never taken over.
func removeStale(path string) error {
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
