package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The interop tests run hack/zmtp_peer.py on Debian's python3-zmq, i.e. on
// real libzmq, the library vLLM's publisher and replay socket use. They skip
// (loudly) when /usr/bin/python3 cannot import zmq, and fail instead when
// KVINDEX_REQUIRE_INTEROP=1 (CI sets it).

const python = "/usr/bin/python3"

// pyPeer is a running zmtp_peer.py; its stdout is read line by line.
type pyPeer struct {
	t     *testing.T
	stdin io.WriteCloser
	lines chan string
}

func startPeer(t *testing.T, args ...string) *pyPeer {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import zmq").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("INTEROP NOT TESTED: %s cannot import zmq (apt-get install -y python3-zmq): %v %s",
			python, err, out)
		if os.Getenv("KVINDEX_REQUIRE_INTEROP") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cmd := exec.Command(python, append([]string{"../../hack/zmtp_peer.py"}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPeer{t: t, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = stdin.Close() // the script exits when stdin closes
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// line returns the next stdout line that starts with prefix's word.
func (p *pyPeer) line(word string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("peer exited before printing %q", word)
		}
		rest, found := strings.CutPrefix(l, word+" ")
		if !found && l != word {
			p.t.Fatalf("peer printed %q, want %q...", l, word)
		}
		return rest
	case <-time.After(30 * time.Second):
		p.t.Fatalf("peer printed no %q within 30 s", word)
	}
	return ""
}

// payload mirrors zmtp_peer.py: bytes 0..255 repeated, rotated left by seq.
func payload(seq, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + seq)
	}
	return b
}

func seq8(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// expectPublished checks what zmtp_peer.py publishes arrives, in order,
// without the "other@" messages.
func expectPublished(t *testing.T, recv func(context.Context) (Message, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for seq := 0; seq <= 5; seq++ {
		m, err := recv(ctx)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		n := 1000 + seq
		if seq == 5 {
			n = 10_000_000
		}
		if len(m.Frames) != 3 || string(m.Frames[0]) != "kv@pod-a@model" || !bytes.Equal(m.Frames[1], seq8(uint64(seq))) {
			t.Fatalf("seq %d: got %d frames, topic %q, seq %x", seq, len(m.Frames), m.Frames[0], m.Frames[1])
		}
		if !bytes.Equal(m.Frames[2], payload(seq, n)) {
			t.Fatalf("seq %d: payload of %d bytes differs from the %d published", seq, len(m.Frames[2]), n)
		}
		if m.Peer == "" {
			t.Fatal("no peer address")
		}
	}
}

func TestInteropSubBoundLibzmqPubConnects(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p := startPeer(t, "pub-connect", "tcp://"+sub.Addr().String())
	// libzmq hands an XPUB each subscription as a message: 1, then the prefix.
	if got := p.line("sub"); got != hex.EncodeToString([]byte("\x01kv@")) {
		t.Fatalf("libzmq saw subscription %s", got)
	}
	expectPublished(t, sub.Recv)
	st := sub.Stats()
	if st.Accepted != 1 || st.Handshakes != 1 || st.Messages != 6 || st.ProtocolErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestInteropSubDialsLibzmqPub(t *testing.T) {
	p := startPeer(t, "pub-bind")
	port := p.line("port")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := DialSub(ctx, "tcp://127.0.0.1:"+port, Options{}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if got := p.line("sub"); got != hex.EncodeToString([]byte("\x01kv@")) {
		t.Fatalf("libzmq saw subscription %s", got)
	}
	expectPublished(t, sub.Recv)
}

func TestInteropDealerLibzmqRouter(t *testing.T) {
	p := startPeer(t, "router-bind")
	port := p.line("port")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := DialDealer(ctx, "tcp://127.0.0.1:"+port, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// vLLM's replay request: an empty delimiter, then the first wanted seq.
	if err := d.Send(ctx, []byte{}, seq8(42)); err != nil {
		t.Fatal(err)
	}
	if got := p.line("got"); got != ","+hex.EncodeToString(seq8(42)) {
		t.Fatalf("ROUTER received %q", got)
	}
	for seq := 0; seq <= 3; seq++ {
		m, err := d.Recv(ctx)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		n := 100 + seq
		if seq == 3 {
			n = 10_000_000
		}
		if len(m.Frames) != 4 || len(m.Frames[0]) != 0 || string(m.Frames[1]) != "kv@pod-a@model" ||
			!bytes.Equal(m.Frames[2], seq8(uint64(seq))) || !bytes.Equal(m.Frames[3], payload(seq, n)) {
			t.Fatalf("seq %d: unexpected reply of %d frames", seq, len(m.Frames))
		}
	}
	m, err := d.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frames) != 4 || !bytes.Equal(m.Frames[2], bytes.Repeat([]byte{0xff}, 8)) || len(m.Frames[3]) != 0 {
		t.Fatalf("end marker: %q", m.Frames)
	}
	p.line("sent")
}
