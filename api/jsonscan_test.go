package api

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/indexer"
)

// TestParseScoreBodyMatchesEncodingJSON checks the hand-written decoder
// against encoding/json on valid bodies.
func TestParseScoreBodyMatchesEncodingJSON(t *testing.T) {
	bodies := []string{
		`{"model":"m","token_ids":[0,1,4294967295]}`,
		` {"model" : "a\"b\\u00e9\n" , "block_hashes" : [18446744073709551615, -1, "42"], "pods":["x","y\u0000z"]}`,
		`{"prompt":"caf\u00e9 ☕","lora_name":null,"cache_salt":"s","pods":null,"token_ids":null}`,
		`{}`,
		`{"token_ids":[1,2],"token_ids":[3],"pods":["a"],"pods":["b"],"block_hashes":[1,2],"block_hashes":[3]}`,
	}
	for _, b := range bodies {
		var got scoreBody
		if err := parseScoreBody([]byte(b), &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		var ref struct {
			Model       *string       `json:"model"`
			Prompt      *string       `json:"prompt"`
			LoraName    *string       `json:"lora_name"`
			CacheSalt   *string       `json:"cache_salt"`
			TokenIDs    []uint32      `json:"token_ids"`
			BlockHashes []json.Number `json:"block_hashes"`
			Pods        []string      `json:"pods"`
		}
		if err := json.Unmarshal([]byte(b), &ref); err != nil {
			t.Fatalf("reference: %s: %v", b, err)
		}
		deref := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		if got.model != deref(ref.Model) || got.prompt != deref(ref.Prompt) || got.cacheSalt != deref(ref.CacheSalt) || got.loraName != deref(ref.LoraName) ||
			!slices.Equal(got.tokens, ref.TokenIDs) || !slices.Equal(got.pods, ref.Pods) || len(got.hashes) != len(ref.BlockHashes) {
			t.Errorf("%s:\n got %+v\n ref %+v", b, got, ref)
		}
	}
}

// FuzzParseScoreBody: never panics, and never accepts what is not JSON.
func FuzzParseScoreBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","token_ids":[1,2]}`, `{"block_hashes":["1",-2]}`, `{"prompt":"\u00e9"}`, `{"pods":[]}`, `{`, `{"token_ids":[1e5]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var sb scoreBody
		if parseScoreBody(b, &sb) == nil && !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
	})
}

// The input limit is enforced while parsing, at exactly indexer.MaxInputLen.
func TestParseScoreBodyInputLimit(t *testing.T) {
	body := func(n int) []byte {
		return []byte(`{"model":"m","token_ids":[` + strings.Repeat("1,", n-1) + `1]}`)
	}
	var sb scoreBody
	if err := parseScoreBody(body(indexer.MaxInputLen), &sb); err != nil || len(sb.tokens) != indexer.MaxInputLen {
		t.Fatalf("%d ids: %v (%d parsed)", indexer.MaxInputLen, err, len(sb.tokens))
	}
	if err := parseScoreBody(body(indexer.MaxInputLen+1), &sb); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d ids: %v", indexer.MaxInputLen+1, err)
	}
}
