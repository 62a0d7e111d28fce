package prefixstore

import (
	"testing"

	"github.com/kvindex/kvindex/tokenization"
)

// Stats must be ordered by model name first and, within a model, rendered
// mode before prompt mode, whatever order the caches were made in (and
// whatever the map's order). The caches are made directly: Stats reads only
// their names and sizes, and two tokenizers are two cache keys.
func TestStatsOrderedByModelThenMode(t *testing.T) {
	s := New(Config{}, tokenization.NewRegistry(tokenization.RegistryConfig{}), nil)
	zz, aa := new(tokenization.Tokenizer), new(tokenization.Tokenizer)
	// made in the reverse of the expected order
	for _, k := range []struct {
		tok  *tokenization.Tokenizer
		name string
	}{{zz, "zz"}, {aa, "aa"}} {
		s.modelStore(storeKey{k.tok, true}, k.name)
		s.modelStore(storeKey{k.tok, false}, k.name)
	}
	want := []Stats{{Model: "aa"}, {Model: "aa", AddSpecialTokens: true}, {Model: "zz"}, {Model: "zz", AddSpecialTokens: true}}
	for range 5 {
		got := s.Stats()
		if len(got) != len(want) {
			t.Fatalf("Stats() = %+v, want 4 caches", got)
		}
		for i := range want {
			if got[i].Model != want[i].Model || got[i].AddSpecialTokens != want[i].AddSpecialTokens {
				t.Fatalf("Stats() = %+v, want order aa/rendered, aa/prompt, zz/rendered, zz/prompt", got)
			}
		}
	}
}
