package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Edges of the state limits: names, model slots, expiry, log limiting.

// Control characters are C0 (< 0x20), DEL and C1 (0x7f..0x9f); space and
// no-break space (0xa0) are ordinary characters.
func TestCheckNameControlRanges(t *testing.T) {
	for name, want := range map[string]string{
		"pod a": "", "pod\u00a0a": "", "pod~": "", "pod\u00ff": "",
		"pod\x1f": "control_char", "pod\x7f": "control_char", "pod\u0080": "control_char", "pod\u009f": "control_char",
	} {
		if got := checkName([]byte(name), 64); got != want {
			t.Errorf("checkName(%q) = %q, want %q", name, got, want)
		}
	}
}

// A model's count is the number of streams under it: the model frees its
// slot (MaxModels) when its last stream is forgotten, not before.
func TestModelSlotFreedByLastStream(t *testing.T) {
	s, _, _ := handleOnly(t, Config{MaxModels: 1}, nil)
	a, b, c := streamKey{"a", 0}, streamKey{"b", 0}, streamKey{"c", 0}
	for _, k := range []streamKey{a, b} {
		if st, why := s.admit(k, "m1"); st == nil {
			t.Fatalf("%v: %s", k, why)
		}
	}
	forget := func(k streamKey) {
		s.mu.Lock()
		s.forgetStreamLocked(k)
		s.mu.Unlock()
	}
	forget(a)
	if st, why := s.admit(c, "m2"); st != nil || why != "model_limit" {
		t.Fatalf("second model admitted while m1 still has a stream: %v %q", st, why)
	}
	if n := s.limits.nModel.Load(); n != 1 {
		t.Fatalf("models gauge %d", n)
	}
	forget(b)
	if n := s.limits.nModel.Load(); n != 0 {
		t.Fatalf("models gauge %d after the last stream", n)
	}
	if st, why := s.admit(c, "m2"); st == nil {
		t.Fatalf("m2 refused after m1's last stream went: %s", why)
	}
}

// A stream last heard from exactly PodExpiry ago is expired (silent for
// PodExpiry, not more).
func TestExpireAtExactlyPodExpiry(t *testing.T) {
	s, _, _ := handleOnly(t, Config{PodExpiry: time.Minute}, nil)
	k := streamKey{"quiet", 0}
	if st, why := s.admit(k, "m"); st == nil {
		t.Fatal(why)
	}
	s.mu.Lock()
	seen := s.limits.seen[k]
	s.mu.Unlock()
	s.expire(context.Background(), time.Unix(0, seen).Add(time.Minute-1))
	if len(s.Streams()) != 1 {
		t.Fatal("expired before PodExpiry")
	}
	s.expire(context.Background(), time.Unix(0, seen).Add(time.Minute))
	if len(s.Streams()) != 0 {
		t.Fatal("not expired at PodExpiry")
	}
}

// A PodExpiry shorter than the ticker's floor still expires (the expiry
// loop ticks at the 10ms floor, never at a non-positive interval).
func TestTinyPodExpiry(t *testing.T) {
	s := startSub(t, Config{Bind: "tcp://127.0.0.1:0", PodExpiry: time.Nanosecond}, &forgetSink{}, NewMetrics(nil))
	ctx := testCtx(t)
	s.handle(ctx, s.bindSrc, frames(t, "kv@quiet@m", 0, storedBatch(1)))
	for len(s.Streams()) != 0 {
		select {
		case <-ctx.Done():
			t.Fatal("stream never expired")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// fillLogKeys gives the limiter maxLogKeys sources, each having logged once
// at now.
func fillLogKeys(l *logLimiter, now time.Time) {
	for i := 0; len(l.buckets) < maxLogKeys; i++ {
		l.allow(fmt.Sprint("src-", i), now)
	}
}

// Refill is one line per logEvery: half a period after the burst is spent,
// still nothing.
func TestLogLimiterRefillRate(t *testing.T) {
	l := newLogLimiter(NewMetrics(nil).limits.logSuppressed)
	now := time.Unix(1000, 0)
	for i := 0; i < logBurst; i++ {
		l.allow("a", now)
	}
	if ok, _ := l.allow("a", now.Add(logEvery/2)); ok {
		t.Fatal("a line allowed half a period after the burst")
	}
	if ok, n := l.allow("a", now.Add(logEvery/2+logEvery)); !ok || n != 1 {
		t.Fatalf("after a period: %v %d", ok, n)
	}
}

// With maxLogKeys sources, a new one first prunes the buckets that are full
// again (idle logBurst*logEvery, nothing owed) and gets its own bucket; a
// bucket owing a summary, or not yet full, is kept.
func TestLogLimiterPruneAtTheCap(t *testing.T) {
	m := NewMetrics(nil)
	now := time.Unix(1000, 0)
	idle := time.Duration(logBurst) * logEvery

	// exactly at the cap, exactly idle long enough: pruned, own bucket
	l := newLogLimiter(m.limits.logSuppressed)
	fillLogKeys(l, now)
	later := now.Add(idle)
	allowed := 0
	for i := 0; i < logBurst+2; i++ {
		if ok, _ := l.allow("new", later); ok {
			allowed++
		}
	}
	if allowed != logBurst || l.buckets["new"] == nil || l.buckets[logOverflow] != nil {
		t.Fatalf("new source at the cap: %d lines allowed, %d buckets", allowed, len(l.buckets))
	}

	// a bucket owing a summary survives the prune, and says so
	l = newLogLimiter(m.limits.logSuppressed)
	for i := 0; i <= logBurst; i++ {
		l.allow("owes", now)
	}
	fillLogKeys(l, now)
	l.allow("new", later)
	if ok, n := l.allow("owes", later); !ok || n != 1 {
		t.Fatalf("source owing a summary: %v %d", ok, n)
	}

	// a spent bucket is not pruned early (it would come back full)
	l = newLogLimiter(m.limits.logSuppressed)
	for i := 0; i < logBurst; i++ {
		l.allow("spent", now)
	}
	fillLogKeys(l, now)
	soon := now.Add(time.Second)
	l.allow("new", soon)
	if ok, _ := l.allow("spent", soon); ok {
		t.Fatal("spent source allowed a line after a prune")
	}
}

// warn adds "suppressed" only when lines were suppressed.
func TestWarnSuppressedAttribute(t *testing.T) {
	h := &countHandler{}
	s, _, _ := handleOnly(t, Config{}, slog.New(h))
	for i := 0; i < logBurst+3; i++ {
		s.warn("k", "w")
	}
	s.logs.mu.Lock()
	s.logs.buckets["k"].tokens = 1 // a period has passed
	s.logs.mu.Unlock()
	s.warn("k", "w")
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.lines) != logBurst+1 {
		t.Fatalf("lines %q", h.lines)
	}
	for i, l := range h.lines {
		if has := strings.Contains(l, "suppressed"); has != (i == logBurst) {
			t.Fatalf("line %d: %q", i, l)
		}
	}
	if !strings.HasSuffix(h.lines[logBurst], "suppressed=3") {
		t.Fatalf("summary line %q", h.lines[logBurst])
	}
}
