package applier

// A pod is untrusted from a failed index write until the applier has
// cleared it, which it does before the pod's next batch (Apply). Apply
// reports the state in its ApplyOutcome; the applier keeps only the
// mechanics and the statistics (PodStats.Untrusted, the untrusted_pods
// gauge). Whether the pod may be served, and whether its stream is
// complete, is decided by the one place that records the outcome: the
// pod's stream state in kvevents, which also asks for the clear of a pod
// that stays quiet (a synthetic AllBlocksCleared batch).

// setUntrusted records a pod's trust transition in the gauge.
func (a *Applier) setUntrusted(pod *podState, untrusted bool) {
	if untrusted {
		a.m.untrustedPods.Inc()
	} else {
		a.m.untrustedPods.Dec()
	}
}
