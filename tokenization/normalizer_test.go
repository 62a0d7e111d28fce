package tokenization

import (
	"testing"

	"golang.org/x/text/unicode/norm"
)

// Reference outputs of HF tokenizers' (Rust, npm tokenizers@0.23.2)
// normalizers, whose Unicode data is older than Go's: marks added since are
// plain starters there (see gen-norm-tables.mjs / unicode_norm_tables.go).
func TestUnicodeNormalizerMatchesReferenceData(t *testing.T) {
	cases := []struct {
		f        norm.Form
		in, want string
	}{
		{norm.NFC, "\u0301\u07fd", "\u0301\u07fd"},
		{norm.NFD, "\u1df6\u0301", "\u1df6\u0301"},
		{norm.NFC, "\U00011935\U00011930", "\U00011935\U00011930"},
		{norm.NFD, "a\U00011938", "a\U00011938"},
		{norm.NFKC, "\U0001e4ec\u0301", "\U0001e4ec\u0301"},
		{norm.NFC, "e\u0301x\u0301\u07fd", "\u00e9x\u0301\u07fd"},
		{norm.NFC, "A\u0308\uFB01", "\u00c4\uFB01"},
		{norm.NFKC, "A\u0308\uFB01", "\u00c4fi"},
		{norm.NFD, "\u00c4", "A\u0308"},
	}
	for _, c := range cases {
		got, err := unicodeNormalizer{c.f}.normalize(normText{s: c.in}, true)
		if err != nil || got.s != c.want {
			t.Errorf("%+q: got %+q want %+q", c.in, got.s, c.want)
		}
	}
}

// Reference (Rust char::to_lowercase via HF Lowercase) results, including a
// mapping newer than Go's Unicode tables (U+16EA0, Unicode 17).
func TestLowercaseMatchesReference(t *testing.T) {
	for in, want := range map[string]string{
		"ABC xyz":        "abc xyz",
		"\u0130stanbul":  "i\u0307stanbul",
		"ΣΑΣ":            "σασ",
		"\U00016EA0":     "\U00016EBB",
		"ǅ Ⅻ Ⓐ":          "ǆ ⅻ ⓐ",
		"\xff invalid A": "\xff invalid a",
	} {
		got, err := lowercaseNormalizer{}.normalize(normText{s: in}, true)
		if err != nil || got.s != want {
			t.Errorf("%+q: got %+q want %+q", in, got.s, want)
		}
	}
}
