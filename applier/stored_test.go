package applier

import (
	"context"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// storedKeys decides without the index: with the index down it still keys a
// mismatching pod's blocks under our keys and aliases the engine's hashes,
// and no call reaches the index; addStored then writes exactly those keys.
func TestStoredKeysDecidesWithoutTheIndex(t *testing.T) {
	e := newApplierEnv(t, cborSeed0)
	toks := seq(0, 12)
	eh := engineKeys(t, blockkeys.KeyConfig{Algo: blockkeys.AlgoSHA256CBOR, Seed: "1", BlockSize: 4}, toks, blockkeys.RequestExtras{})
	want := ourKeys(t, cborSeed0, toks, blockkeys.RequestExtras{})
	pod := e.a.pod(&event.Batch{Pod: "p", Model: testModel})
	e.a.bindModel(pod, testModel, blockkeys.EngineVLLM)
	e.idx.down = true

	ev := stored(eh, toks, 4, 0, 3)
	var d batchDelta
	keys, countHeld := e.a.storedKeys(pod, blockkeys.EngineVLLM, &ev, &d)
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %x, want our keys %x", keys, want)
	}
	if len(e.idx.calls) != 0 {
		t.Fatalf("storedKeys called the index: %v", e.idx.calls)
	}
	if d.mismatches != 3 || d.matches != 0 || d.stored != 0 || d.hint == "" {
		t.Fatalf("delta %+v: want 3 mismatches, a hint, nothing stored", d)
	}
	for i, h := range eh {
		if k, ok := pod.alias.get(h); !ok || k != want[i] {
			t.Fatalf("alias of block %d: %x %v, want %x", i, k, ok, want[i])
		}
	}

	e.idx.down = false
	if err := e.a.addStored(context.Background(), pod, &ev, keys, countHeld, &d); err != nil {
		t.Fatal(err)
	}
	if d.stored != 3 || e.idx.count(pod.id) != 3 || !e.idx.has(pod.id, want[2]) {
		t.Fatalf("after addStored: stored %d, index holds %d", d.stored, e.idx.count(pod.id))
	}
}
