package applier

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The applier remembers which pods stored blocks for a session (vLLM's
// BlockStored.session_id) with the session's last block, at most
// SessionsPerPod per pod: the least recently stored session goes first
// (counted), a session stored again is kept; a cleared pod forgets its
// sessions.
func TestSessionsBoundedPerPod(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{SessionsPerPod: 3})
	tokens := seq(100, 4*8)
	h := engineKeys(t, cborSeed0, tokens, blockkeys.RequestExtras{})
	keys := ourKeys(t, cborSeed0, tokens, blockkeys.RequestExtras{})
	store := func(pod, session string, from, to int) {
		ev := stored(h, tokens, 4, from, to)
		ev.SessionID = session
		e.apply(pod, 0, blockkeys.EngineVLLM, ev)
	}
	pods := func(session string) []string {
		var out []string
		for _, id := range e.a.SessionPods(nil, session) {
			name, _ := e.in.PodName(id)
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	store("a", "s1", 0, 2)
	store("b", "s1", 0, 1)
	store("a", "s2", 0, 1)
	store("a", "s3", 0, 1)
	if got := pods("s1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("s1 on %v", got)
	}
	if k, ok := e.a.SessionLastBlock(e.podID("a", 0), "s1"); !ok || k != keys[1] {
		t.Fatalf("s1's last block on a: %v %v, want %v", k, ok, keys[1])
	}
	store("a", "s1", 2, 3) // s1 stored again: now the most recent on a
	if k, _ := e.a.SessionLastBlock(e.podID("a", 0), "s1"); k != keys[2] {
		t.Fatalf("s1's last block after a new store: %v, want %v", k, keys[2])
	}
	store("a", "s4", 3, 4) // a is full: s2, the least recently stored, goes
	if got := pods("s2"); len(got) != 0 {
		t.Fatalf("s2 kept on %v", got)
	}
	for _, s := range []string{"s1", "s3", "s4"} {
		if got := pods(s); !slices.Contains(got, "a") {
			t.Fatalf("%s lost from a: %v", s, got)
		}
	}
	if n, ev := e.metric("kvindexd_session_entries"), e.metric("kvindexd_session_evictions_total"); n != 4 || ev != 1 {
		t.Fatalf("entries %v evictions %v", n, ev)
	}
	// many sessions through one pod: still bounded
	for i := 0; i < 100; i++ {
		store("b", fmt.Sprint("x", i), 0, 1)
	}
	if n := len(e.a.sessions.pods[e.podID("b", 0)].last); n != 3 {
		t.Fatalf("b remembers %d sessions", n)
	}
	if r := len(e.a.sessions.pods[e.podID("b", 0)].ring); r > 6 {
		t.Fatalf("b's ring holds %d slots for 3 sessions", r)
	}
	// a cleared pod forgets its sessions; a removal does not
	e.apply("a", 0, blockkeys.EngineVLLM, event.Event{Kind: event.BlockRemoved, BlockHashes: h[:1]})
	if got := pods("s4"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("s4 after a removal: %v", got)
	}
	e.apply("a", 0, blockkeys.EngineVLLM, event.Event{Kind: event.AllBlocksCleared})
	if got := pods("s4"); len(got) != 0 {
		t.Fatalf("s4 after a clear: %v", got)
	}
	if n := e.metric("kvindexd_session_entries"); n != 3 {
		t.Fatalf("entries after clear %v", n)
	}
}

// SessionsPerPod < 0 remembers nothing.
func TestSessionsOff(t *testing.T) {
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{SessionsPerPod: -1})
	tokens := seq(100, 8)
	ev := stored(engineKeys(t, cborSeed0, tokens, blockkeys.RequestExtras{}), tokens, 4, 0, 2)
	ev.SessionID = "s"
	e.apply("a", 0, blockkeys.EngineVLLM, ev)
	if got := e.a.SessionPods(nil, "s"); len(got) != 0 {
		t.Fatalf("sessions kept while off: %v", got)
	}
}

// Issue 35: sessions had no global cap (1,200 pods x 4,096 unique ids held
// 4.9M sessions, 3.3 GB). All pods together hold at most MaxSessions: a
// flood of pods with unique ids stops at the cap, evicting the flooders' own
// sessions, and an honest pod below its fair part keeps all of its.
func TestSessionsGlobalCap(t *testing.T) {
	const perPod, global = 64, 200
	e, _ := limitedEnv(t, cborSeed0, nil, Limits{SessionsPerPod: perPod, MaxSessions: global})
	tokens := seq(100, 4*2)
	h := engineKeys(t, cborSeed0, tokens, blockkeys.RequestExtras{})
	store := func(pod, session string) {
		ev := stored(h, tokens, 4, 0, 1)
		ev.SessionID = session
		e.apply(pod, 0, blockkeys.EngineVLLM, ev)
	}
	const honest = 3 // below its fair part, global / 51 pods
	for i := range honest {
		store("honest", fmt.Sprintf("h%d", i))
	}
	for p := range 50 {
		for i := range perPod {
			store(fmt.Sprintf("flood-%d", p), fmt.Sprintf("f%d-%d", p, i))
		}
	}
	if n := e.metric("kvindexd_session_entries"); n != global {
		t.Errorf("session_entries %v, want the cap %d", n, global)
	}
	if v := e.metric("kvindexd_session_cap_evictions_total"); v != 50*perPod+honest-global {
		t.Errorf("session_cap_evictions_total %v, want %d", v, 50*perPod+honest-global)
	}
	for i := range honest {
		if _, ok := e.a.SessionLastBlock(e.podID("honest", 0), fmt.Sprintf("h%d", i)); !ok {
			t.Errorf("the honest pod lost session h%d to the flood", i)
		}
	}
	// the flooders end with about a fair part each, none far above it
	for p := range 50 {
		n := 0
		for i := range perPod {
			if _, ok := e.a.SessionLastBlock(e.podID(fmt.Sprintf("flood-%d", p), 0), fmt.Sprintf("f%d-%d", p, i)); ok {
				n++
			}
		}
		if n > global/51+2 {
			t.Errorf("flood-%d holds %d sessions, fair part %d", p, n, global/51)
		}
	}
}
