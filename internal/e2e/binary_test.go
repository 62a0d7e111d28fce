package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/logtest"
)

// TestBinaryServeAndGracefulStop builds the real kvindexd binary, stamped
// as make build stamps it, checks --version reports the stamp, runs it the
// way an operator does (flags + KVINDEX_* env), checks it serves, and that
// SIGTERM (Kubernetes) and SIGINT (Ctrl-C) each stop it cleanly: exit
// status 0, so `make run` ends without an error.
func TestBinaryServeAndGracefulStop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := harness.BuildDaemon(harness.RepoRoot(t), t.TempDir(),
		append(harness.BuildFlags(), "-ldflags", "-X main.version=v0.0.0-e2e -X main.commit=e2e0123")...)
	if err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(bin, "help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "serve") || !strings.Contains(string(out), "blockhash") {
		t.Fatalf("kvindexd help: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "--version").CombinedOutput()
	if want := "kvindexd v0.0.0-e2e\ncommit:     e2e0123\ngo version: go"; err != nil || !strings.HasPrefix(string(out), want) {
		t.Fatalf("kvindexd --version: %v\n%s\nwant it to start with:\n%s", err, out, want)
	}

	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) { serveUntil(t, bin, sig) })
	}
}

// serveUntil runs bin serve, checks it answers a score, sends sig and
// expects a graceful exit with status 0.
func serveUntil(t *testing.T, bin string, sig os.Signal) {
	httpAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	cmd := exec.Command(bin, "--grpc-addr", fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		"--zmq-bind", fmt.Sprintf("tcp://127.0.0.1:%d", harness.FreePort(t)), "--log-format", "json")
	cmd.Env = append(cmd.Environ(), "KVINDEX_HTTP_ADDR="+httpAddr, "KVINDEX_HASH_SEED=0")
	logs := &logtest.Buffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	if err := harness.WaitReady(httpAddr, exited, harness.ReadyLimit); err != nil {
		t.Fatalf("daemon not ready: %v\n%s", err, logs.String())
	}
	if resp, err := http.Get("http://" + httpAddr + "/readyz"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.TrimSpace(string(body)) != "ok" {
			t.Fatalf("/readyz answered %q, want ok", body)
		}
	}
	resp, err := http.Post("http://"+httpAddr+"/v1/score", "application/json",
		strings.NewReader(`{"model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "{\"total_blocks\":1,\"pods\":[]}\n" {
		t.Fatalf("score: %d %q", resp.StatusCode, body)
	}

	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit after %v: %v (want status 0)\n%s", sig, waitErr, logs.String())
		}
	case <-time.After(harness.StopLimit):
		t.Fatalf("no exit within %v after %v\n%s", harness.StopLimit, sig, logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"shutting down"`) {
		t.Errorf("no shutdown log:\n%s", logs.String())
	}
}
