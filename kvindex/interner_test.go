package kvindex

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// Interning new names from many goroutines at once must give every caller
// the same id and create each once: the write-locked re-check is what stops
// two goroutines that both missed under the read lock from each appending
// an id.
func TestInternerConcurrentFirstSight(t *testing.T) {
	const goroutines, names = 8, 2000
	for round := 0; round < 5; round++ {
		in := NewInterner()
		var ready atomic.Int32
		var done sync.WaitGroup
		ids := make([][]PodID, goroutines)
		models := make([][]ModelID, goroutines)
		for g := 0; g < goroutines; g++ {
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Add(1)
				for ready.Load() < goroutines { // start together
					runtime.Gosched()
				}
				for i := 0; i < names; i++ {
					ids[g] = append(ids[g], in.Pod(fmt.Sprint("pod-", i), 0))
					models[g] = append(models[g], in.Model(fmt.Sprint("model-", i)))
				}
			}()
		}
		done.Wait()
		if n := in.NumPods(); n != names {
			t.Fatalf("round %d: NumPods = %d after interning %d names", round, n, names)
		}
		if s := in.ModelName(names); s != "" {
			t.Fatalf("round %d: more than %d model ids", round, names)
		}
		for g := 1; g < goroutines; g++ {
			if !slices.Equal(ids[g], ids[0]) || !slices.Equal(models[g], models[0]) {
				t.Fatalf("round %d: goroutines got different ids for the same names", round)
			}
		}
		for i := 0; i < names; i++ {
			if got := in.PodsNamed(fmt.Sprint("pod-", i)); len(got) != 1 {
				t.Fatalf("round %d: PodsNamed(pod-%d) = %v", round, i, got)
			}
		}
	}
}

// The first unknown id is the one just past the last interned: it must
// answer "unknown", not index past the end.
func TestInternerNamesJustPastTheEnd(t *testing.T) {
	in := NewInterner()
	in.Pod("a", 0)
	in.Pod("b", 3)
	in.Model("m")
	if n, r := in.PodName(PodID(in.NumPods())); n != "" || r != 0 {
		t.Errorf("PodName(NumPods()) = %q %d, want \"\" 0", n, r)
	}
	if n, r := in.PodName(1); n != "b" || r != 3 {
		t.Errorf("PodName(1) = %q %d", n, r)
	}
	if s := in.ModelName(1); s != "" {
		t.Errorf("ModelName(1) = %q with one model", s)
	}
	if s := NewInterner().ModelName(0); s != "" {
		t.Errorf("ModelName(0) of an empty interner = %q", s)
	}
	if n, _ := NewInterner().PodName(0); n != "" {
		t.Errorf("PodName(0) of an empty interner = %q", n)
	}
}
