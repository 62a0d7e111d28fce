package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
)

// A daemon that fails to start after its ZMQ socket is bound (here: the
// HTTP port is taken) must release that socket, or a retry in the same
// process could never bind it again.
func TestFailedStartReleasesZMQBind(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	zmqPort := harness.FreePort(t)
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr = "", taken.Addr().String()
	cfg.ZMQBind = fmt.Sprintf("tcp://127.0.0.1:%d", zmqPort)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := newDaemon(context.Background(), cfg, log); err == nil || !strings.Contains(err.Error(), "--http-addr") {
		t.Fatalf("newDaemon with a taken HTTP port: %v", err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", zmqPort))
	if err != nil {
		t.Fatalf("ZMQ bind port still held after the failed start: %v", err)
	}
	l.Close()
}
