package api

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
)

// /v1/status names the daemon's default block-key config, so a publisher
// can hash as the daemon does.
func TestStatusKeys(t *testing.T) {
	keys := blockkeys.KeyConfig{Algo: blockkeys.AlgoXXHashCBOR, Seed: "42", BlockSize: 32}
	st := newStackWith(t, indexer.Config{Keys: keys, ModelKeys: map[string]blockkeys.KeyConfig{"big": testKeys}})
	resp, err := http.Get(st.http.URL + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Keys *StatusKeys `json:"keys"`
	}
	err = json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	want := StatusKeys{HashAlgo: "xxhash_cbor", HashSeed: "42", BlockSize: 32}
	if err != nil || s.Keys == nil || *s.Keys != want {
		t.Fatalf("/v1/status keys %+v (%v), want %+v", s.Keys, err, want)
	}
}
