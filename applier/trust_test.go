package applier

import (
	"context"
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

// A pod that goes quiet after an index error must not wait for its next batch
// to be cleared: Recover clears it once the index answers again, and until
// then Trusted tells the read path to leave it out of scores.
func TestApplierRecoverQuietPod(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 8)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	e.apply("q", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 0, 1))
	id, other := e.podID("p", 0), e.podID("q", 0)

	e.idx.setDown(true)
	e.apply("p", 0, blockkeys.EngineVLLM, stored(eh, toks, 4, 1, 2))
	if e.a.Trusted(id) || !e.a.Trusted(other) {
		t.Fatal("after the failed write p must be untrusted and q trusted")
	}
	if n, err := e.a.Recover(context.Background()); n != 0 || err == nil {
		t.Fatalf("Recover while the index is down = %d, %v; want 0 and an error", n, err)
	}
	if e.a.Trusted(id) {
		t.Fatal("p trusted although its clear failed")
	}

	e.idx.setDown(false)
	calls := len(e.idx.log())
	if n, err := e.a.Recover(context.Background()); n != 1 || err != nil {
		t.Fatalf("Recover after the index is back = %d, %v; want 1, nil", n, err)
	}
	if got := e.idx.log()[calls:]; len(got) != 1 || got[0] != fmt.Sprintf("clear pod=%d", id) {
		t.Fatalf("Recover made calls %v; want exactly one clear of p", got)
	}
	if !e.a.Trusted(id) || e.pod("p", 0).Untrusted || e.idx.count(id) != 0 {
		t.Fatalf("p after recovery: trusted=%v stats=%+v held=%d", e.a.Trusted(id), e.pod("p", 0), e.idx.count(id))
	}
	if e.metric("kvindexd_untrusted_pods") != 0 || e.metric("kvindexd_recovery_clears_total") != 1 {
		t.Fatal("metrics after Recover")
	}
	// nothing left to do: no further index calls
	calls = len(e.idx.log())
	if n, _ := e.a.Recover(context.Background()); n != 0 || len(e.idx.log()) != calls {
		t.Fatal("Recover with no untrusted pod touched the index")
	}
}

// TestApplierRecoverRacesApply: Recover (the daemon's background loop) runs
// while pods apply batches and the index goes down and up under them. Trust
// bookkeeping must stay consistent: once the index is back and Recover has
// run, every pod is trusted, Trusted agrees with PodStats, and the
// untrusted-pods gauge is back to 0 (an Inc without its Dec, or the reverse,
// would leave it off). Run under -race this also checks the locking.
func TestApplierRecoverRacesApply(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(1, 16)
	eh := engineKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	ctx := context.Background()
	stop := make(chan struct{})
	started := make(chan struct{})
	recovered := make(chan struct{})
	go func() { // the recovery loop and the read path
		defer close(recovered)
		for i := 0; ; i++ {
			_, _ = e.a.Recover(ctx)
			for p := 0; p < 4; p++ {
				if id, ok := e.in.LookupPod(fmt.Sprintf("pod-%d", p), 0); ok {
					e.a.Trusted(id)
				}
			}
			if i == 0 {
				close(started)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-started
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
		}(p)
	}
	wg.Wait()
	close(stop)
	<-recovered

	for p := 0; p < 4; p++ {
		e.idx.setPodDown(e.podID(fmt.Sprintf("pod-%d", p), 0), false)
	}
	if _, err := e.a.Recover(ctx); err != nil {
		t.Fatalf("Recover with the index up: %v", err)
	}
	for _, ps := range e.a.PodStats() {
		id := e.podID(ps.Pod, ps.DPRank)
		if ps.Untrusted || !e.a.Trusted(id) {
			t.Errorf("%s after recovery: untrusted=%v trusted=%v", ps.Pod, ps.Untrusted, e.a.Trusted(id))
		}
		if ps.IndexErrors == 0 {
			t.Errorf("%s never saw an index error: the test did not exercise recovery", ps.Pod)
		}
	}
	if g := e.metric("kvindexd_untrusted_pods"); g != 0 {
		t.Errorf("untrusted_pods gauge = %v after every pod recovered, want 0", g)
	}
}
