//go:build !race

package prefixstore

const raceEnabled = false
