package applier

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// BenchmarkSessionMemoryAtCap fills the session table to DefaultMaxSessions
// with unique ids of event.MaxSessionIDLen bytes over 1,200 pods at the
// default per-pod bound (issue 35's attack, stopped by the cap) and reports
// the heap it holds: bytes/session is what docs/security.md's memory bound
// counts per session. Run with -benchtime 1x.
func BenchmarkSessionMemoryAtCap(b *testing.B) {
	pad := strings.Repeat("s", event.MaxSessionIDLen-16)
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m, _ := newSessionMetrics("bench")
		t := &sessionTable{limit: DefaultSessionsPerPod, global: DefaultMaxSessions, pods: map[kvindex.PodID]*podSessions{}, m: m}
		for i := range 1200 * DefaultSessionsPerPod {
			t.record(kvindex.PodID(i%1200), fmt.Sprintf("%s%016x", pad, i), 1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(t.n), "sessions")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(t.n), "bytes/session")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB")
		runtime.KeepAlive(t)
	}
}
