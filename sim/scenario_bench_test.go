package sim

import "testing"

// BenchmarkScenario73Capacity runs each scheduler of the committed llm-d
// 73-capacity scenario once per iteration (17,213 requests, 8 pods).
func BenchmarkScenario73Capacity(b *testing.B) {
	sc, err := ReadScenarioFile("testdata/scenarios/llm-d-73-capacity.yaml")
	if err != nil {
		b.Fatal(err)
	}
	wl := sc.generateWorkload()
	for _, spec := range sc.Schedulers {
		b.Run(spec.Name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				run, err := newScenarioRun(sc, wl, spec)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := run.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
