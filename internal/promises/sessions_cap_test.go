package promises

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/pypub"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// Sessions are held to both caps as docs/security.md states them: a pod
// keeps its --max-sessions-per-pod most recent sessions, and all pods
// together keep --max-sessions; each eviction is counted.
func TestPromiseSessionsCapped(t *testing.T) {
	t.Parallel()
	pypub.RequirePython(t)
	d := harness.Start(t, "--max-sessions", "8", "--max-sessions-per-pod", "4")
	pub := pypub.StartPublisher(t, d.ZMQ, false)
	const pods, perPod = 3, 6
	for p := range pods {
		for s := range perPod {
			pub.Send(pypub.Batch{Topic: fmt.Sprintf("kv@pod-%d@%s", p, model), Seq: uint64(s), Form: "map",
				Events: []pypub.Event{{Type: "BlockStored", BlockHashes: []uint64{uint64(1000*p + s + 1)},
					BlockSize: blockSize, SessionID: fmt.Sprintf("session-%d-%d", p, s)}}})
		}
	}
	wait.Until(t, "every session's batch applied", func() string {
		for p := range pods {
			if pod, ok := d.Pod(fmt.Sprintf("pod-%d", p)); !ok || pod.EventsApplied != perPod {
				return fmt.Sprintf("pod-%d: %+v", p, pod)
			}
		}
		return ""
	})
	if v := d.Metric("kvindexd_session_entries"); v != 8 {
		t.Errorf("kvindexd_session_entries = %v, want the global cap 8", v)
	}
	// 18 sessions stored, 8 kept: 10 evicted, at the per-pod cap or the
	// global one (which comes first depends on the apply order).
	perPodEv, capEv := d.Metric("kvindexd_session_evictions_total"), d.Metric("kvindexd_session_cap_evictions_total")
	if perPodEv+capEv != pods*perPod-8 || capEv == 0 {
		t.Errorf("evictions: %v at the per-pod cap, %v at the global cap; want %d in all, some at the global cap", perPodEv, capEv, pods*perPod-8)
	}
}
