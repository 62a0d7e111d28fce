package tokenization

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Edges of the BPE model and the added-token trie that the fixture and
// variant tokenizers never reach: single-character words under
// end_of_word_suffix, characters with no id and no unk_token, byte-fallback
// vocabularies missing some bytes, dropout values, duplicate added tokens.
// Expected ids follow HF tokenizers' BPE::merge_word: the prefix goes on every
// character but the first, the suffix on the last, and a character with no
// id becomes its <0xXX> byte tokens (all of them or none), else unk_token,
// else nothing.

// tinyBPE is a tokenizer.json with the given pre-tokenizer and BPE model
// fields (JSON fragments) and no merges.
func tinyBPE(t *testing.T, pre, model string) *Tokenizer {
	t.Helper()
	js := fmt.Sprintf(`{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":%s,
		"post_processor":null,"decoder":null,"model":{"type":"BPE","merges":[],%s}}`, pre, model)
	tk, err := Load([]byte(js), nil)
	if err != nil {
		t.Fatalf("load: %v\n%s", err, js)
	}
	return tk
}

const splitOnSpace = `{"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":false}`

func expectIDs(t *testing.T, tk *Tokenizer, text string, want []uint32) {
	t.Helper()
	got, err := tk.Encode(text, false)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Encode(%q) = %v %v, want %v", text, got, err, want)
	}
}

func TestBPEPrefixAndSuffixOnShortWords(t *testing.T) {
	vocab := `{"a":0,"##a":1,"a</w>":2,"##a</w>":3,"b":4,"##b":5,"b</w>":6,"##b</w>":7}`
	both := tinyBPE(t, splitOnSpace, `"continuing_subword_prefix":"##","end_of_word_suffix":"</w>","vocab":`+vocab)
	expectIDs(t, both, "a", []uint32{2}) // first and last: suffix, no prefix
	expectIDs(t, both, "ab", []uint32{0, 7})
	expectIDs(t, both, "aba b", []uint32{0, 5, 3, 6})
	suffixOnly := tinyBPE(t, splitOnSpace, `"end_of_word_suffix":"</w>","vocab":`+vocab)
	expectIDs(t, suffixOnly, "a", []uint32{2})
	expectIDs(t, suffixOnly, "ab", []uint32{0, 6})
	prefixOnly := tinyBPE(t, splitOnSpace, `"continuing_subword_prefix":"##","vocab":`+vocab)
	expectIDs(t, prefixOnly, "b", []uint32{4})
	expectIDs(t, prefixOnly, "ba", []uint32{4, 1})
}

// Without unk_token a character with no id is dropped, never given some id.
func TestBPEUnknownCharacterWithoutUnkToken(t *testing.T) {
	tk := tinyBPE(t, splitOnSpace, `"unk_token":null,"vocab":{"a":0,"b":1,"c":2}`)
	expectIDs(t, tk, "axb", []uint32{0, 1})
	expectIDs(t, tk, "x", []uint32{})
	// the ByteLevel alphabet: a byte whose character is not in the vocab
	bl := tinyBPE(t, `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`,
		`"unk_token":null,"vocab":{"a":0,"b":1,"c":2}`)
	expectIDs(t, bl, "azb", []uint32{0, 1})
}

// byte_fallback uses a character's byte tokens only when every byte has one
// (<0x63> has id 0 here: id 0 is a real id); otherwise the character is unk.
func TestBPEByteFallbackWithMissingBytes(t *testing.T) {
	tk := tinyBPE(t, splitOnSpace, `"unk_token":"<unk>","byte_fallback":true,
		"vocab":{"<0x63>":0,"<unk>":1,"a":2,"<0xC3>":3,"<0xA9>":4,"<0xA8>":5}`)
	expectIDs(t, tk, "c", []uint32{0})
	expectIDs(t, tk, "acd", []uint32{2, 0, 1}) // 'd' has no byte token
	expectIDs(t, tk, "é", []uint32{3, 4})      // C3 A9
	expectIDs(t, tk, "ü", []uint32{1})         // C3 BC: BC is missing
}

// Dropout is a training feature: a model that enables it is refused, one that
// sets it to 0 (or null) loads.
func TestBPEDropoutValues(t *testing.T) {
	for _, c := range []struct {
		dropout string
		ok      bool
	}{{"null", true}, {"0", true}, {"0.0", true}, {"0.5", false}, {"0.1", false}} {
		js := `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,
			"decoder":null,"model":{"type":"BPE","dropout":` + c.dropout + `,"merges":[],"vocab":{"a":0}}}`
		_, err := Load([]byte(js), nil)
		if (err == nil) != c.ok {
			t.Errorf("dropout %s: err = %v, want ok=%v", c.dropout, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "dropout") {
			t.Errorf("dropout %s: error %q does not name dropout", c.dropout, err)
		}
	}
}

// Two added tokens with the same content: the first listed is the one
// matched (HF gives a repeated content the id it already has).
func TestAddedTokenTrieFirstOfDuplicatesWins(t *testing.T) {
	toks := []*addedToken{{ID: 7, Content: "<t>"}, {ID: 8, Content: "<t>"}, {ID: 9, Content: "<u>"}}
	tr := newTokenTrie(toks, func(a *addedToken) string { return a.Content })
	sp := tr.split("x<t>y<u>", nil)
	var ids []uint32
	for _, s := range sp {
		if s.tok != nil {
			ids = append(ids, s.tok.ID)
		}
	}
	if !slices.Equal(ids, []uint32{7, 9}) {
		t.Fatalf("added tokens found: %v, want [7 9]", ids)
	}
}

// The BPE word cache holds at most its capacity, spread over 32 shards: a
// shard keeps up to capacity/32 words and starts afresh when one more comes.
func TestWordCacheBound(t *testing.T) {
	const capacity = 256 // 8 words a shard
	c := newWordCache(capacity)
	size := func() (n int) {
		for i := range c.shards {
			n += len(c.shards[i].m)
		}
		return n
	}
	// eight words of one shard are all kept; a ninth empties it first
	var same []string
	for i := 0; len(same) < 9; i++ {
		w := fmt.Sprint("w", i)
		if c.shard(w) == c.shard("w0") {
			same = append(same, w)
		}
	}
	for i, w := range same[:8] {
		c.put(w, []uint32{uint32(i)})
	}
	for i, w := range same[:8] {
		if ids, ok := c.get(w); !ok || !slices.Equal(ids, []uint32{uint32(i)}) {
			t.Fatalf("word %d of a shard not kept: %v %v", i, ids, ok)
		}
	}
	c.put(same[8], []uint32{8})
	if n := len(c.shard("w0").m); n != 1 {
		t.Fatalf("shard holds %d words after one past its share, want 1", n)
	}
	for i := 0; i < 20000; i++ {
		c.put(fmt.Sprint("x", i), []uint32{1})
		if n := size(); n > capacity {
			t.Fatalf("cache holds %d words, capacity %d", n, capacity)
		}
	}
}
