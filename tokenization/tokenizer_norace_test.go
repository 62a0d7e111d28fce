//go:build !race

package tokenization

const raceEnabled = false
