package zmtp

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// Shared budgets a few peers could hold: the buffer budget (large partial
// messages), the time a message may take, and the connection slots.

// Four peers each declare a frame of the maximum size, send over a quarter
// of it and go quiet. Large messages together stop at three quarters of
// the budget, so the fourth is closed and an ordinary publisher still gets
// through while the other three hold theirs.
func TestLargePartialMessagesLeaveRoomForSmallOnes(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MaxMessageSize: 4 << 20, MaxBufferedBytes: 16 << 20}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var held []net.Conn
	for i := 0; i < 4; i++ {
		c := dialRaw(t, sub.Addr())
		handshakeAsPub(t, c, 1)
		// 1 MiB + 1 byte: the buffer has grown to the whole 4 MiB frame.
		if _, err := c.Write(cat(longHeader(0, 4<<20), make([]byte, 1<<20+1))); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if i < 3 {
			wait.For(t, "the frame's buffer grown", func() bool { return sub.sock.budget.used.Load() >= int64(i+1)*(4<<20) })
		}
	}
	expectClosed(t, held[3])
	wait.For(t, "the fourth counted", func() bool { return sub.Stats().BudgetExceeded == 1 })
	expectGoodPublisher(t, sub)
	if s := sub.Stats(); s.Open != 4 { // three held, the good publisher
		t.Fatalf("the three large messages within their share should still be read: %+v", s)
	}
}

// A message that stops arriving gives its budget back after MessageTimeout,
// and the disconnect says a message was lost.
func TestStalledMessageIsCutOff(t *testing.T) {
	var mu sync.Mutex
	var gone []error
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MessageTimeout: 300 * time.Millisecond,
		OnDisconnect: func(_ string, err error) { mu.Lock(); gone = append(gone, err); mu.Unlock() }}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	c := dialRaw(t, sub.Addr())
	handshakeAsPub(t, c, 1)
	write(t, c, cat([]byte{0x01, 4}, []byte("kv@a"), longHeader(0, 1<<20), make([]byte, 100)))
	expectClosed(t, c)
	wait.For(t, "the timeout counted", func() bool { return sub.Stats().MessageTimeouts == 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(gone) != 1 || !errors.Is(gone[0], ErrMessageLost) || !errors.Is(gone[0], ErrMessageTimeout) {
		t.Fatalf("disconnect reasons %v, want one lost message by timeout", gone)
	}
	if used := sub.sock.budget.used.Load(); used != 0 {
		t.Fatalf("%d bytes still reserved", used)
	}
	// A peer idle between messages is not cut off by it.
	idle := dialRaw(t, sub.Addr())
	handshakeAsPub(t, idle, 1)
	if closedWithin(idle, time.Second) {
		t.Fatal("an idle connection was closed by the message timeout")
	}
}

func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	for {
		_, err := c.Read(b[:])
		if err == nil {
			continue
		}
		var ne net.Error
		return !errors.As(err, &ne) || !ne.Timeout()
	}
}

// dialFrom connects from a given loopback address: hosts the socket knows
// apart.
func dialFrom(t *testing.T, ip string, addr net.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A full socket evicts a handshaked peer that has delivered nothing for
// EvictIdleAfter rather than refusing an engine.
func TestFullSocketEvictsIdlePeer(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MaxConns: 2, EvictIdleAfter: time.Nanosecond}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	a, b := dialFrom(t, "127.0.0.2", sub.Addr()), dialFrom(t, "127.0.0.2", sub.Addr())
	handshakeAsPub(t, a, 1)
	handshakeAsPub(t, b, 1)
	wait.For(t, "two handshakes", func() bool { return sub.Stats().Handshakes == 2 })
	// Handshaking (not yet handshaked) peers are never evicted: the
	// handshake deadline bounds them.
	expectGoodPublisher(t, sub)
	if s := sub.Stats(); s.Evicted != 1 || s.Rejected != 0 {
		t.Fatalf("want one idle peer evicted, none refused: %+v", s)
	}
}

// Strangers cannot take the last MaxConns/8 slots: a host that delivered a
// message gets back in while a flood of never-publishing peers is refused.
func TestLastSlotsKeptForKnownHosts(t *testing.T) {
	sub, err := ListenSub("tcp://127.0.0.1:0", Options{MaxConns: 8}, "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	first := dialRaw(t, sub.Addr()) // from 127.0.0.1, known once it delivers
	handshakeAsPub(t, first, 1)
	write(t, first, rawMessage([]byte("kv@good"), seq8(1), []byte("payload")))
	if _, err := sub.Recv(context.Background()); err != nil {
		t.Fatal(err)
	}
	first.Close()
	wait.For(t, "the engine gone", func() bool { return sub.Stats().Open == 0 })
	for i := 0; i < 7; i++ {
		handshakeAsPub(t, dialFrom(t, "127.0.0.2", sub.Addr()), 1)
	}
	wait.For(t, "the strangers' handshakes", func() bool { return sub.Stats().Handshakes == 8 })
	expectClosed(t, dialFrom(t, "127.0.0.2", sub.Addr()))
	wait.For(t, "the eighth stranger refused", func() bool { return sub.Stats().Rejected == 1 })
	expectGoodPublisher(t, sub) // the engine reconnecting takes the kept slot
}
