//go:build race

package e2e

// buildFlags builds the daemon under test with the instrumentation of the
// test binary itself. Under `go test -race ./...` (make test) every package
// of kvindexd is then already in the build cache from compiling the tests,
// so the build is a link; a plain build would compile the whole dependency
// tree (client-go, gRPC: ~300 CPU-seconds on a fresh machine) a second time
// without -race for this one test. The race-built daemon also fails the
// test (exit status 66) on a data race during serve and shutdown.
var buildFlags = []string{"-race"}
