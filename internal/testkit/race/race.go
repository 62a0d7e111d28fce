//go:build race

// Package race tells a test whether it runs under the race detector, which
// changes what some tests can check: sync.Pool drops items at random (so
// allocation counts of pooled paths mean nothing), and everything runs
// several times slower (so exhaustive loops are trimmed).
package race

// Enabled is true in a binary built with -race.
const Enabled = true
