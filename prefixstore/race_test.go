//go:build race

package prefixstore

// raceEnabled trims the property tests under -race, which is ~10x slower; the full
// iteration counts run in the normal (non-race) test pass.
const raceEnabled = true
