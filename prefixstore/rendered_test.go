package prefixstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Rendered chats are tokenized with add_special_tokens=false. For a model
// whose post-processor adds BOS (Llama 3.1) the two modes give different ids
// for one text, so they must not share cached segments: each mode stays
// exact even when both see the same conversation, and a growing
// conversation reuses its previous turn in the rendered mode.
func TestRenderedModeExactAndSeparate(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3_1"} {
		t.Run(model, func(t *testing.T) {
			tok := needModel(t, model)
			m := NewMetrics(nil)
			s := New(Config{ChunkBytes: 128}, registry(), m)
			r := rand.New(rand.NewPCG(21, 22))
			conv := "<|begin_of_text|><|im_start|>system\n" + randomText(r, nil, 2000)
			for turn := 0; turn < 6; turn++ {
				conv += fmt.Sprintf("<|im_end|>\n<|im_start|>user\nturn %d: ", turn) + randomText(r, nil, 700)
				hitsBefore, reusedBefore := value(m.hits), value(m.reusedTokens)
				got, err := s.TokenizeRendered(context.Background(), model, conv)
				if err != nil {
					t.Fatal(err)
				}
				want, err := tok.Encode(conv, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("turn %d: rendered-mode ids differ from Encode(text, false)", turn)
				}
				if turn > 0 && (value(m.hits) != hitsBefore+1 || value(m.reusedTokens) <= reusedBefore) {
					t.Fatalf("turn %d did not reuse the previous turn (hits %v -> %v)", turn, hitsBefore, value(m.hits))
				}
				// The same text in prompt mode, after the rendered mode cached
				// it: exact too (Encode(text, true)), never the other mode's ids.
				checkExact(t, s, tok, model, conv)
			}
			st := s.Stats()
			if len(st) != 2 || st[0].AddSpecialTokens || !st[1].AddSpecialTokens {
				t.Fatalf("stats %+v: want one cache per mode", st)
			}
		})
	}
}
