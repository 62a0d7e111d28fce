package applier

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// fakeIndex is a deliberately simple Index for the applier tests: a set of
// (model, pod, tier, key) entries, a call log, and failure injection
// (down = every call fails; podDown = every call for that pod fails;
// failOn = the n-th call from now fails).
type fakeIndex struct {
	mu      sync.Mutex
	held    map[fakeEntry]struct{}
	calls   []string
	down    bool
	podDown map[kvindex.PodID]bool
	failOn  int // 0 = off; counts down on every call
}

type fakeEntry struct {
	model kvindex.ModelID
	pod   kvindex.PodID
	tier  event.Tier
	key   blockkeys.Key
}

var errFakeDown = errors.New("fake index: down")

func newFakeIndex() *fakeIndex {
	return &fakeIndex{held: map[fakeEntry]struct{}{}, podDown: map[kvindex.PodID]bool{}}
}

// call logs a call for pod and reports whether it must fail. mu is held.
func (f *fakeIndex) call(pod kvindex.PodID, s string) error {
	f.calls = append(f.calls, s)
	if f.down || f.podDown[pod] {
		return errFakeDown
	}
	if f.failOn > 0 {
		f.failOn--
		if f.failOn == 0 {
			return errFakeDown
		}
	}
	return nil
}

func (f *fakeIndex) Add(_ context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call(pod, fmt.Sprintf("add pod=%d n=%d", pod, len(keys))); err != nil {
		return err
	}
	for _, k := range keys {
		f.held[fakeEntry{model, pod, tier, k}] = struct{}{}
	}
	return nil
}

func (f *fakeIndex) Remove(_ context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call(pod, fmt.Sprintf("remove pod=%d n=%d", pod, len(keys))); err != nil {
		return err
	}
	for _, k := range keys {
		delete(f.held, fakeEntry{model, pod, tier, k})
	}
	return nil
}

func (f *fakeIndex) ClearPod(_ context.Context, pod kvindex.PodID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call(pod, fmt.Sprintf("clear pod=%d", pod)); err != nil {
		return err
	}
	for e := range f.held {
		if e.pod == pod {
			delete(f.held, e)
		}
	}
	return nil
}

func (f *fakeIndex) Lookup(_ context.Context, model kvindex.ModelID, keys []blockkeys.Key, v kvindex.Visitor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range keys {
		var hs []kvindex.Holder
		for e := range f.held {
			if e.model == model && e.key == k {
				hs = append(hs, kvindex.Holder{Pod: e.pod, Tier: e.tier})
			}
		}
		if len(hs) == 0 || !v.Visit(i, k, hs) {
			return nil
		}
	}
	return nil
}

func (f *fakeIndex) PodBlocks(_ context.Context, pod kvindex.PodID) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for e := range f.held {
		if e.pod == pod {
			n++
		}
	}
	return n, nil
}

func (f *fakeIndex) Stats() kvindex.IndexStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return kvindex.IndexStats{Entries: int64(len(f.held))}
}

// has reports whether pod holds key (any model or tier).
func (f *fakeIndex) has(pod kvindex.PodID, key blockkeys.Key) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for e := range f.held {
		if e.pod == pod && e.key == key {
			return true
		}
	}
	return false
}

func (f *fakeIndex) count(pod kvindex.PodID) int {
	n, _ := f.PodBlocks(context.Background(), pod)
	return int(n)
}

func (f *fakeIndex) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

// setPodDown makes every call for pod fail (or not).
func (f *fakeIndex) setPodDown(pod kvindex.PodID, down bool) {
	f.mu.Lock()
	f.podDown[pod] = down
	f.mu.Unlock()
}

func (f *fakeIndex) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// heldFakeIndex is fakeIndex that also reports, as the in-memory index
// does (kvindex.HeldAdder), which keys the pod already held.
type heldFakeIndex struct{ *fakeIndex }

func (f heldFakeIndex) AddHeld(_ context.Context, model kvindex.ModelID, pod kvindex.PodID, tier event.Tier, keys []blockkeys.Key, held []bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call(pod, fmt.Sprintf("add pod=%d n=%d", pod, len(keys))); err != nil {
		return err
	}
	for i, k := range keys {
		e := fakeEntry{model, pod, tier, k}
		_, held[i] = f.held[e]
		f.held[e] = struct{}{}
	}
	return nil
}
