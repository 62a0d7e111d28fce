package bytebudget

import (
	"context"
	"errors"
	"testing"
	"time"
)

type gaugeValue struct{ v float64 }

func (g *gaugeValue) Set(v float64) { g.v = v }

// The in-flight budget grants in arrival order, refuses with ErrBusy after the wait,
// returns the context's error when the request ends first, and gives back what it took.
func TestByteBudget(t *testing.T) {
	g := &gaugeValue{}
	b := New(100, g)
	ctx := context.Background()
	if err := b.Acquire(ctx, 60, time.Second); err != nil {
		t.Fatal(err)
	}
	if g.v != 60 {
		t.Fatalf("gauge %v, want 60", g.v)
	}
	// 50 does not fit: it waits, and is refused when nothing is released
	if err := b.Acquire(ctx, 50, 10*time.Millisecond); !errors.Is(err, ErrBusy) {
		t.Fatalf("err = %v, want ErrBusy", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Acquire(cctx, 50, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// a waiting large request is not overtaken by a small one that would fit
	granted := make(chan int, 2)
	go func() {
		if b.Acquire(ctx, 50, time.Minute) == nil {
			granted <- 50
		}
	}()
	for {
		b.mu.Lock()
		n := len(b.waiters)
		b.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	go func() {
		if b.Acquire(ctx, 10, time.Minute) == nil {
			granted <- 10
		}
	}()
	for {
		b.mu.Lock()
		n := len(b.waiters)
		b.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// 10 would fit next to the 60 held, but waits behind the 50
	if h := b.Used(); h != 60 {
		t.Fatalf("held %d while the 50 waits, want 60 (the 10 overtook it)", h)
	}
	b.Release(60)
	if a, c := <-granted, <-granted; a+c != 60 {
		t.Fatalf("granted %d and %d, want 50 and 10", a, c)
	}
	b.Release(50)
	b.Release(10)
	if b.Used() != 0 || g.v != 0 {
		t.Fatalf("held %d, gauge %v after every release", b.Used(), g.v)
	}
}
