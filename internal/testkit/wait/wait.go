// Package wait is the one way a test waits for a state that arrives
// asynchronously (an event applied, a connection closed, a log line
// written): poll a condition until it holds, and fail with what was last
// seen when a deadline passes.
//
// The deadline is a hang guard, never the thing under test: a test that
// must pass on a loaded two-core machine under the race detector judges
// what the code did, not how fast. So there is one generous Limit, and
// UntilWithin only for waits that are long by nature (a daemon applying
// hundreds of thousands of blocks under -race). A test that means to
// assert a duration says so in its own code, next to the reason.
//
// It does not own waiting on a channel or a notify hook: a test that has
// one selects on it directly.
package wait

import (
	"testing"
	"time"
)

// Limit is how long For and Until poll before they fail the test.
const Limit = 30 * time.Second

// maxInterval caps the pause between two polls; polls start at a
// millisecond, so a state that arrives at once is seen at once, and back
// off so a slow one does not busy the CPU the code under test needs.
const maxInterval = 25 * time.Millisecond

// For polls cond until it returns true and fails the test, naming what,
// when it has not after Limit.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilWithin(t, Limit, what, func() string {
		if cond() {
			return ""
		}
		return "not yet"
	})
}

// Until polls check until it returns "". Any other answer describes the
// state seen; the last one is in the failure when Limit passes.
func Until(t testing.TB, what string, check func() string) {
	t.Helper()
	UntilWithin(t, Limit, what, check)
}

// UntilWithin is Until with its own limit, for the waits that are long by
// nature; the limit is still a hang guard.
func UntilWithin(t testing.TB, limit time.Duration, what string, check func() string) {
	t.Helper()
	start := time.Now()
	interval := time.Millisecond
	for {
		last := check()
		if last == "" {
			return
		}
		if time.Since(start) > limit {
			t.Fatalf("gave up waiting for %s after %v: %s", what, limit, last)
		}
		time.Sleep(interval)
		interval = min(2*interval, maxInterval)
	}
}
