package applier

import (
	"context"
	"time"

	"github.com/kvindex/kvindex/kvindex"
)

// setUntrusted records a pod's trust transition for Trusted and the gauge.
func (a *Applier) setUntrusted(ps *podState, untrusted bool) {
	a.untrustedMu.Lock()
	if untrusted {
		a.untrustedIDs[ps.id] = struct{}{}
		a.m.untrustedPods.Inc()
	} else {
		delete(a.untrustedIDs, ps.id)
		a.m.untrustedPods.Dec()
	}
	a.nUntrusted.Store(int32(len(a.untrustedIDs)))
	a.untrustedMu.Unlock()
}

// Trusted reports whether what the index holds for pod can be served. A pod
// is untrusted from an index error until the applier has cleared it: scores
// must leave it out meanwhile, or entries written before a lost removal would
// be served as if they were still cached.
func (a *Applier) Trusted(pod kvindex.PodID) bool {
	if a.nUntrusted.Load() == 0 {
		return true
	}
	a.untrustedMu.RLock()
	_, bad := a.untrustedIDs[pod]
	a.untrustedMu.RUnlock()
	return !bad
}

// Recover clears every untrusted pod in the index and trusts it again when
// the clear succeeds. Apply does the same before an untrusted pod's next
// batch; Recover covers pods that stay quiet after the index comes back.
// It returns how many pods were recovered and the last index error.
func (a *Applier) Recover(ctx context.Context) (int, error) {
	if a.nUntrusted.Load() == 0 {
		return 0, nil
	}
	a.mu.RLock()
	var todo []*podState
	for _, ps := range a.pods {
		if !a.Trusted(ps.id) {
			todo = append(todo, ps)
		}
	}
	a.mu.RUnlock()
	var n int
	var lastErr error
	for _, ps := range todo {
		ps.applyMu.Lock()
		if ps.untrusted {
			if err := a.idx.ClearPod(ctx, ps.id); err != nil {
				lastErr = err
			} else {
				ps.untrusted = false
				ps.resetHolding()
				ps.mu.Lock()
				ps.st.Untrusted = false
				ps.mu.Unlock()
				a.setUntrusted(ps, false)
				a.m.recoveryClears.Inc()
				n++
				a.log.Info("pod cleared after index error; trusted again, rebuilding from new events", "pod", ps.name, "dp_rank", ps.rank)
			}
		}
		ps.applyMu.Unlock()
	}
	return n, lastErr
}

// RunRecovery calls Recover every interval until ctx is done.
func (a *Applier) RunRecovery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := a.Recover(ctx); err != nil {
				a.log.Debug("index still failing; untrusted pods wait", "err", err)
			}
		}
	}
}
