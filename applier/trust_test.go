package applier

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The applier error contract: an index error counts, marks the pod untrusted
// and drops the rest of the batch; the next batch first clears the pod, and
// only a successful clear makes it trusted again.
func TestApplierUntrustedRecovery(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 16)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	id := e.podID("p", 0)

	e.idx.mu.Lock()
	e.idx.failOn = 2 // the second call from now fails
	e.idx.mu.Unlock()
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 1, 2), stored(eh, toks, 4, 2, 3), stored(eh, toks, 4, 3, 4))
	p := e.pod("p", 0)
	if !p.Untrusted || p.IndexErrors != 1 || p.EventsApplied != 2 || e.idx.has(id, blockkeys.Key(eh[3])) {
		t.Fatalf("after failure: %+v", p)
	}
	if e.metric("kvindexd_untrusted_pods") != 1 || e.metric("kvindexd_index_errors_total") != 1 {
		t.Fatal("metrics after failure")
	}

	e.idx.setDown(true)
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 3, 4))
	p = e.pod("p", 0)
	if !p.Untrusted || p.IndexErrors != 2 || p.EventsApplied != 2 {
		t.Fatalf("while down: %+v", p)
	}
	calls := e.idx.log()
	if last := calls[len(calls)-1]; !strings.HasPrefix(last, "clear") {
		t.Fatalf("untrusted pod's batch did not start with ClearPod: %v", calls)
	}

	e.idx.setDown(false)
	n := len(e.idx.log())
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 2))
	calls = e.idx.log()[n:]
	if len(calls) != 2 || calls[0] != fmt.Sprintf("clear pod=%d", id) || !strings.HasPrefix(calls[1], "add") {
		t.Fatalf("recovery calls %v", calls)
	}
	p = e.pod("p", 0)
	if p.Untrusted || p.EventsApplied != 3 || e.idx.count(id) != 2 {
		t.Fatalf("after recovery: %+v, %d held", p, e.idx.count(id))
	}
	if e.metric("kvindexd_untrusted_pods") != 0 || e.metric("kvindexd_recovery_clears_total") != 1 {
		t.Fatal("metrics after recovery")
	}
	// other pods are unaffected by one pod's trouble
	e.apply("other", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	if e.pod("other", 0).Untrusted {
		t.Fatal("other pod untrusted")
	}
}

func TestApplierAllBlocksClearedError(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	e.idx.setDown(true)
	e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared})
	if p := e.pod("p", 0); !p.Untrusted || p.Clears != 0 || p.IndexErrors != 1 {
		t.Fatalf("%+v", p)
	}
}

// A pod that goes quiet after an index error is cleared by the clear batch
// its recorder (kvevents) queues for it: the outcome says untrusted while the
// index is down, and trusted once the clear went through, with nothing left
// of the pod in the index. Other pods are never reported untrusted.
func TestApplierOutcomeOfAQuietPodsClear(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	if o := e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1)); o.IndexFailed {
		t.Fatal("a good write reported failed")
	}
	id := e.podID("p", 0)
	e.idx.setDown(true)
	if o := e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 1, 2)); !o.IndexFailed {
		t.Fatal("the failed write was not reported")
	}
	if o := e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared}); !o.IndexFailed {
		t.Fatal("a clear that failed reported the pod trusted")
	}
	e.idx.setDown(false)
	if o := e.apply("p", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared}); o.IndexFailed {
		t.Fatal("the clear went through but the pod is still reported untrusted")
	}
	if e.pod("p", 0).Untrusted || e.idx.count(id) != 0 {
		t.Fatalf("p after its clear: %+v, %d held", e.pod("p", 0), e.idx.count(id))
	}
	if e.metric("kvindexd_untrusted_pods") != 0 || e.metric("kvindexd_recovery_clears_total") != 1 {
		t.Fatal("metrics after the clear")
	}
	if o := e.apply("q", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1)); o.IndexFailed {
		t.Fatal("another pod reported untrusted")
	}
}

// TestApplierUntrustedRacesApply: pods apply batches while the index goes
// down and up under them. Trust bookkeeping must stay consistent: the last
// outcome of each pod agrees with PodStats, and once every pod's last batch
// went through, the untrusted-pods gauge is back to 0 (an Inc without its
// Dec, or the reverse, would leave it off). Run under -race this also
// checks the locking.
func TestApplierUntrustedRacesApply(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 16)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	stop := make(chan struct{})
	read := make(chan struct{})
	go func() { // the statistics readers
		defer close(read)
		for {
			_ = e.a.PodStats()
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			name := fmt.Sprintf("pod-%d", p)
			id := e.in.Pod(name, 0)
			for r := 0; r < 50; r++ {
				// every third round the index fails this pod's writes
				e.idx.setPodDown(id, (r+p)%3 == 0)
				e.apply(name, 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 4))
				e.apply(name, 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: eh[2:]})
			}
			e.idx.setPodDown(id, false)
			if o := e.apply(name, 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared}); o.IndexFailed {
				t.Errorf("%s: the clear with the index up reported failed", name)
			}
		}(p)
	}
	wg.Wait()
	close(stop)
	<-read
	for _, pod := range e.a.PodStats() {
		if pod.Untrusted {
			t.Errorf("%s untrusted after a clear that went through", pod.Pod)
		}
		if pod.IndexErrors == 0 {
			t.Errorf("%s never saw an index error: the test did not exercise recovery", pod.Pod)
		}
	}
	if g := e.metric("kvindexd_untrusted_pods"); g != 0 {
		t.Errorf("untrusted_pods gauge = %v after every pod recovered, want 0", g)
	}
}
