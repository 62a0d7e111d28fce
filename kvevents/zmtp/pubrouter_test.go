package zmtp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/wait"
)

func gotLine(frames ...[]byte) string {
	sum := sha256.Sum256(frames[len(frames)-1])
	return fmt.Sprintf("%x %d %x", frames[0], len(frames), sum)
}

func waitTopic(t *testing.T, pub *Pub, topic string) {
	t.Helper()
	wait.For(t, "subscribed to "+topic, func() bool { return slices.Contains(pub.Topics(), topic) })
}

// publishAndCheck sends what the libzmq SUB must (and must not) receive.
func publishAndCheck(t *testing.T, pub *Pub, p *pyPeer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := [][][]byte{
		{[]byte("kv@pod-a@model"), seq8(0), payload(0, 1000)},
		{[]byte("kv@pod-a@model"), seq8(1), payload(1, 10_000_000)},
		{[]byte("kv@pod-b@model"), seq8(2), payload(2, 5)},
	}
	if err := pub.Send(ctx, []byte("other@pod-c"), seq8(9), []byte("not for kv@")); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := pub.Send(ctx, m...); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range msgs {
		if got, want := p.line("got"), gotLine(m...); got != want {
			t.Fatalf("message %d: libzmq got %s, want %s", i, got, want)
		}
	}
	p.line("done")
}

func TestInteropPubBoundLibzmqSubConnects(t *testing.T) {
	pub, err := ListenPub("tcp://127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	p := startPeer(t, "sub-connect", "tcp://"+pub.Addr().String(), "3")
	waitTopic(t, pub, "kv@")
	publishAndCheck(t, pub, p)
}

func TestInteropPubDialsLibzmqSub(t *testing.T) {
	p := startPeer(t, "sub-bind", "3")
	port := p.line("port")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := DialPub(ctx, "tcp://127.0.0.1:"+port, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	waitTopic(t, pub, "kv@")
	publishAndCheck(t, pub, p)
}

func TestInteropRouterLibzmqDealer(t *testing.T) {
	r, err := ListenRouter("tcp://127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := startPeer(t, "dealer-connect", "tcp://"+r.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := r.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frames) != 3 || len(m.Frames[0]) != 5 || m.Frames[0][0] != 0 || len(m.Frames[1]) != 0 ||
		hex.EncodeToString(m.Frames[2]) != hex.EncodeToString(seq8(42)) {
		t.Fatalf("request %q", m.Frames)
	}
	id := m.Frames[0]
	replies := [][][]byte{
		{{}, []byte("kv@pod-a@model"), seq8(0), payload(0, 100)},
		{{}, []byte("kv@pod-a@model"), seq8(1), payload(1, 10_000_000)},
		{{}, {}, seq8(1<<64 - 1), {}},
	}
	for _, rep := range replies {
		if err := r.Send(ctx, append([][]byte{id}, rep...)...); err != nil {
			t.Fatal(err)
		}
	}
	for i, rep := range replies {
		if got, want := p.line("got"), gotLine(rep...); got != want {
			t.Fatalf("reply %d: libzmq got %s, want %s", i, got, want)
		}
	}
	p.line("done")
	if err := r.Send(ctx, []byte("nobody"), []byte("x")); err == nil || !strings.Contains(err.Error(), "no peer") {
		t.Fatalf("unknown routing id: %v", err)
	}
}

// A subscriber can make a Pub hold only so many subscriptions; CANCEL
// removes them.
func TestPubSubscriptionLimits(t *testing.T) {
	pub, err := ListenPub("tcp://127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	handshake := func() []byte { return cat(rawGreeting(1), rawReady("SUB")) }
	sub := func(topic string) []byte { return rawCommand([]byte("\x09SUBSCRIBE" + topic)) }

	c := dialRaw(t, pub.Addr())
	write(t, c, cat(handshake(), sub("kv@"), sub("x"), rawCommand([]byte("\x06CANCELx"))))
	wait.For(t, "kv@ subscribed, x cancelled", func() bool { return slices.Equal(pub.Topics(), []string{"kv@"}) })
	// A ZMTP 3.0 subscriber's subscription message works too.
	c0 := dialRaw(t, pub.Addr())
	write(t, c0, cat(rawGreeting(0), rawReady("SUB"), rawMessage([]byte("\x01legacy"))))
	wait.For(t, "legacy subscribed", func() bool { return slices.Equal(pub.Topics(), []string{"kv@", "legacy"}) })

	many := handshake()
	for i := range maxSubscriptions + 1 {
		many = append(many, sub(fmt.Sprint(i))...)
	}
	c2 := dialRaw(t, pub.Addr())
	write(t, c2, many)
	expectClosed(t, c2)
	long := dialRaw(t, pub.Addr())
	write(t, long, cat(rawGreeting(0), rawReady("SUB"), rawMessage(append([]byte{1}, make([]byte, maxTopicSize+1)...))))
	expectClosed(t, long)
	wait.For(t, "both counted", func() bool { return pub.Stats().Oversized == 2 })
	if got := pub.Topics(); !slices.Equal(got, []string{"kv@", "legacy"}) {
		t.Fatalf("topics %q", got)
	}
}
