package main

import (
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
)

// Issue 32: the daemon's default seed is vLLM's with PYTHONHASHSEED unset;
// it warns only where that cannot match (the xxhash family seeds randomly)
// and stays quiet for a seed set on purpose.
func TestSeedWarning(t *testing.T) {
	if DefaultConfig().HashSeed != blockkeys.DefaultSeed {
		t.Fatalf("default --hash-seed %q, want %q", DefaultConfig().HashSeed, blockkeys.DefaultSeed)
	}
	for _, algo := range blockkeys.HashAlgos {
		w := seedWarning(string(algo), blockkeys.DefaultSeed)
		if algo.RandomSeed() != (w != "") {
			t.Errorf("%s with the default seed: warning %q", algo, w)
		}
		if w != "" && !strings.Contains(w, "PYTHONHASHSEED") {
			t.Errorf("%s: warning %q does not say what to set", algo, w)
		}
		if w := seedWarning(string(algo), "0"); w != "" {
			t.Errorf("%s with seed 0: warning %q", algo, w)
		}
	}
}
