//go:build !race

package e2e

// buildFlags: see race_test.go. Without -race the tests' packages are
// compiled plainly, and so is the daemon.
var buildFlags []string
