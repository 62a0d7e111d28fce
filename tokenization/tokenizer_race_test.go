//go:build race

package tokenization

// raceEnabled trims the exhaustive tests under -race (CI runs them in full
// without it): only the committed qwen3 fixture is loaded.
const raceEnabled = true
