//go:build race

package kvindex

// hashRaceEnabled: under -race sync.Pool drops items at random, so allocation
// counts of pooled paths are not meaningful.
const hashRaceEnabled = true
