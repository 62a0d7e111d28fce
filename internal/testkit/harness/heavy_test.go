package harness

import (
	"sync/atomic"
	"testing"
	"time"
)

// Heavy tests never overlap, however many run in parallel.
func TestHeavyRunsOneAtATime(t *testing.T) {
	var running, most atomic.Int32
	for range 4 {
		t.Run("heavy", func(t *testing.T) {
			t.Parallel()
			Heavy(t)
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(10 * time.Millisecond)
		})
	}
	t.Cleanup(func() {
		if m := most.Load(); m != 1 {
			t.Errorf("%d heavy tests ran at once", m)
		}
	})
}
