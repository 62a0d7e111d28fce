//go:build race

package promises

// buildFlags builds the daemon under test with the instrumentation of the
// test binary itself (as internal/e2e does): under `go test -race` every
// package of kvindexd is already compiled with -race, so the build is a
// link, and a data race in the daemon fails the scenario (exit status 66).
var buildFlags = []string{"-race"}

// raceBuild: the daemon runs several times slower and its memory includes the
// race detector's shadow memory; scenarios that depend on either adapt.
const raceBuild = true
