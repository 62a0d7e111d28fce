//go:build !race

package kvindex

const hashRaceEnabled = false
