package promises

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

// Issue 35 (state budgets): what hostile publishers can make the daemon hold
// or claim, on the shipped binary at its defaults.

// One batch with seq 2^64-1 after seq 0 is a gap, counted once; what it adds to
// kvindexd_kvevents_missed_batches_total is bounded (2^24 per jump), not 1.8e19.
func TestPromiseMissedBatchesBoundedPerJump(t *testing.T) {
	t.Parallel()
	d := harness.Start(t)
	pub := d.Publisher()
	toks := prompt(3, 1)
	publish(t, pub, "pod-jump", model, 0, stored(engineHashes(t, toks), toks))
	more := prompt(4, 1)
	publish(t, pub, "pod-jump", model, 1<<64-1, stored(engineHashes(t, more), more))
	wait.Until(t, "the gap", func() string {
		if v := d.Metric("kvindexd_kvevents_seq_gaps_total"); v != 1 {
			return fmt.Sprintf("seq_gaps_total %v", v)
		}
		return ""
	})
	if v := d.Metric("kvindexd_kvevents_missed_batches_total"); v != 1<<24 {
		t.Errorf("missed_batches_total = %v after one jump to 2^64-1, want the bound 2^24", v)
	}
}
