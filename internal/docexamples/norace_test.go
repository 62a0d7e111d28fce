//go:build !race

package docexamples

// buildFlags: a plain build when the test itself is not under -race.
var buildFlags []string
