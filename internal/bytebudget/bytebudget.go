// Package bytebudget is a weighted semaphore over bytes with a bounded
// wait, served in arrival order: the daemon's budgets for prompts being
// tokenized (prefixstore) and request bodies being read (api).
package bytebudget

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrBusy is Acquire's error when the bytes did not come free in time.
var ErrBusy = errors.New("byte budget in use")

// Budget is a weighted semaphore over bytes, served in arrival order so a
// large holder is not starved by a stream of small ones.
type Budget struct {
	mu      sync.Mutex
	size    int
	held    int
	waiters []*budgetWaiter
	gauge   interface{ Set(float64) }
}

type budgetWaiter struct {
	n     int
	ready chan struct{} // closed when the bytes were granted
}

// New is a budget of size bytes; gauge (required) follows what is held.
func New(size int, gauge interface{ Set(float64) }) *Budget {
	return &Budget{size: size, gauge: gauge}
}

// Size is the budget.
func (b *Budget) Size() int { return b.size }

// Used is what is held.
func (b *Budget) Used() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// Acquire takes n bytes (n <= size), waiting at most wait for them; it
// returns ErrBusy after wait, or ctx's error when ctx ends first.
func (b *Budget) Acquire(ctx context.Context, n int, wait time.Duration) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.held+n <= b.size {
		b.held += n
		b.gauge.Set(float64(b.held))
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = ErrBusy
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted meanwhile: give it back
		b.held -= n
	default:
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
	}
	b.grant()
	return err
}

// Release gives back n bytes taken by Acquire.
func (b *Budget) Release(n int) {
	b.mu.Lock()
	b.held -= n
	b.grant()
	b.mu.Unlock()
}

// grant hands bytes to the waiters at the head of the queue. Called with mu.
func (b *Budget) grant() {
	for len(b.waiters) > 0 && b.held+b.waiters[0].n <= b.size {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.held += w.n
		close(w.ready)
	}
	b.gauge.Set(float64(b.held))
}
