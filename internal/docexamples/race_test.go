//go:build race

package docexamples

// buildFlags builds the daemon with the test binary's instrumentation: under
// `go test -race` every package of kvindexd is already compiled with -race,
// so the build is a link, and a data race the examples provoke fails them.
var buildFlags = []string{"-race"}
