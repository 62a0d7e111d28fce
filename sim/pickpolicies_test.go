package sim

import (
	"testing"

	"github.com/kvindex/kvindex/indexer/routing"
)

// Every daemon policy runs as a scenario scheduler, as a bare name
// ("pick:<policy>", package routing on the simulator's index) and as a
// router ("router: pick:<policy>", the daemon's whole indexer.Pick), and
// the cache-aware ones reuse the shared prefixes.
func TestDaemonPickPoliciesInScenarios(t *testing.T) {
	sc := parseSmall(t, "")
	sc.Schedulers = nil
	for _, n := range routing.Names() {
		sc.Schedulers = append(sc.Schedulers, schedulerSpec{Name: "pick:" + n}, schedulerSpec{Name: "daemon-" + n, Router: "pick:" + n})
	}
	if err := sc.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := RunScenario(sc)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		name := r.Scheduler
		if name == "pick:least-loaded" || name == "daemon-least-loaded" {
			continue
		}
		if r.HitRate < 0.2 {
			t.Errorf("%s: hit rate %.2f", name, r.HitRate)
		}
	}
}
