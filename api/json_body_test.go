package api

import (
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Edges of the JSON request bodies and pod filters: each test names what
// it holds.

// A pods filter naming only unknown pods answers nothing, also when the
// server's result pool was emptied (two GCs drop every pooled Result, so
// the request gets a fresh one whose candidate buffer is nil).
func TestUnknownPodFilterAfterPoolIsEmptied(t *testing.T) {
	st := newStack(t)
	tokens := seqTokens(1, 4*testBlock)
	st.store("pod-a", 0, event.TierGPU, tokens, 4, blockkeys.RequestExtras{})
	body := `{"model":"` + testModel + `","token_ids":` + jsonInts(tokens) + `,"pods":["nope"]}`
	for i := 0; i < 3; i++ {
		runtime.GC()
		runtime.GC()
		if got := summaryHTTP(st.scoreHTTP(body)); got != "total=4" {
			t.Fatalf("request %d, unknown pod filter: %s, want no pods", i, got)
		}
	}
}

// appendString must write valid JSON and valid UTF-8 for any name: control
// characters escaped, invalid UTF-8 replaced as encoding/json does.
func TestAppendStringAnyBytes(t *testing.T) {
	for _, s := range []string{"plain-pod", "", "a b", "\x00", "\x1f", "x\x7f", "tab\there", "q\"uote", "back\\slash",
		"caf\u00e9", "\xff", "\x80", "a\xc3", "\xed\xa0\x80", "\u2028", "<&>", " ~"} {
		out := appendString(nil, s)
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("appendString(%q) = %q: not valid JSON/UTF-8", s, out)
		}
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		// encoding/json is the reference (it replaces each invalid byte)
		var want string
		ref, _ := json.Marshal(s)
		_ = json.Unmarshal(ref, &want)
		if got != want {
			t.Fatalf("appendString(%q) decodes to %q, want %q", s, got, want)
		}
	}
}

// The request scanner refuses raw control characters below 0x20 in strings
// (as JSON does) and accepts 0x20 and above.
func TestScanStringControlCharacters(t *testing.T) {
	for c := 0; c < 0x80; c++ {
		if c == '"' || c == '\\' {
			continue
		}
		body := `{"model":"a` + string(rune(c)) + `b","token_ids":[1]}`
		var sb scoreBody
		err := parseScoreBody([]byte(body), &sb)
		if (err != nil) != (c < 0x20) {
			t.Fatalf("byte 0x%02x in a string: err %v", c, err)
		}
		if err == nil && sb.model != "a"+string(rune(c))+"b" {
			t.Fatalf("byte 0x%02x: model %q", c, sb.model)
		}
	}
	// Bytes 0x80 and above: what encoding/json makes of the string (invalid
	// UTF-8 becomes U+FFFD), never the raw bytes.
	for c := 0x80; c < 0x100; c++ {
		lit := `"a` + string([]byte{byte(c)}) + `b"`
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatal(err)
		}
		var sb scoreBody
		if err := parseScoreBody([]byte(`{"model":`+lit+`,"token_ids":[1]}`), &sb); err != nil || sb.model != want {
			t.Fatalf("byte 0x%02x in a string: model %q err %v, want %q", c, sb.model, err, want)
		}
	}
	// names with such bytes are escaped on the way out too
	st := newStack(t)
	st.store("pod\x01\xff", 0, event.TierGPU, seqTokens(1, 8), 2, blockkeys.RequestExtras{})
	code, b := st.post("/v1/score", `{"model":"`+testModel+`","token_ids":`+jsonInts(seqTokens(1, 8))+`}`)
	if code != http.StatusOK || !json.Valid(b) || !utf8.Valid(b) || !strings.Contains(string(b), `"pod":"pod\u0001\ufffd"`) {
		t.Fatalf("%d %s", code, b)
	}
}

// Every prefix of a valid body is an error, never a panic or an accepted
// request: the scanner checks the end of input wherever it looks ahead.
func TestParseScoreBodyEveryTruncation(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","token_ids":[1,22,333],"pods":null,"lora_name":null}`,
		`{"model":"caf\u00e9","block_hashes":["18446744073709551615",-1,7],"pods":["a","b"],"cache_salt":"s"}`,
		`{"prompt":"a\"b","model":"m","token_ids":null,"block_hashes":null}`,
	} {
		var sb scoreBody
		if err := parseScoreBody([]byte(body), &sb); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		for i := 0; i < len(body); i++ {
			if err := parseScoreBody([]byte(body[:i]), &sb); err == nil {
				t.Fatalf("prefix %q accepted", body[:i])
			}
		}
	}
}

// An empty block_hashes list is no input (like an absent one): with
// token_ids it is not "two inputs".
func TestEmptyBlockHashesIsNoInput(t *testing.T) {
	var sb scoreBody
	if err := parseScoreBody([]byte(`{"model":"m","token_ids":[1,2],"block_hashes":[]}`), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.hasHashes || !sb.hasTokens {
		t.Fatalf("hasHashes %v hasTokens %v", sb.hasHashes, sb.hasTokens)
	}
}
