package api

import (
	"fmt"
	"net"
	"strings"

	"github.com/kvindex/kvindex/internal/unixsock"
)

// UnixPrefix marks a listen address as a unix socket path:
// unix:///run/kvindex.sock (the form gRPC clients dial as well).
const UnixPrefix = "unix://"

// UnixSocketMode is the permission of a unix socket file the daemon
// creates (unixsock.Mode: owner and group may connect, nobody else).
const UnixSocketMode = unixsock.Mode

// Listen opens a listen address: host:port on TCP, or unix:///path for a
// unix socket, created with UnixSocketMode after removing a stale socket
// file (unixsock.Listen). Closing the listener removes the socket file.
func Listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, UnixPrefix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if path == "" {
		return nil, fmt.Errorf("%q: want unix:///absolute/path", addr)
	}
	return unixsock.Listen(path, UnixSocketMode)
}
