//go:build race

package kvindex

// raceEnabled: the race detector makes sync.Pool drop items on purpose, so
// allocation counts are only checked without it.
const raceEnabled = true
