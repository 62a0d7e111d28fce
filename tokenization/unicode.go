package tokenization

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// byteLevelChars is the GPT-2 byte-to-unicode table used by the ByteLevel
// pre-tokenizer: printable Latin-1 bytes map to themselves, every other byte
// to U+0100 + n in byte order. Vocabularies of byte-level models are written
// in these characters.
var byteLevelChars [256]rune

// byteLevelInverse maps a byte-level character back to its byte.
var byteLevelInverse map[rune]byte

func init() {
	n := rune(0)
	byteLevelInverse = make(map[rune]byte, 256)
	for b := 0; b < 256; b++ {
		if (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255) {
			byteLevelChars[b] = rune(b)
		} else {
			byteLevelChars[b] = 256 + n
			n++
		}
		byteLevelInverse[byteLevelChars[b]] = byte(b)
	}
}

// byteLevelDecode converts a byte-level vocabulary entry back to raw bytes.
// ok is false when the entry contains a character outside the table (such an
// entry can never be produced by byte-level pre-tokenization).
func byteLevelDecode(s string) (string, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteLevelInverse[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}

// isRustWhitespace reports Rust's char::is_whitespace (the Unicode
// White_Space property), which is what HF uses for lstrip/rstrip/Strip.
func isRustWhitespace(r rune) bool {
	return unicode.IsSpace(r)
}

// isWordChar mirrors HF's single_word test (char::is_alphanumeric || '_').
func isWordChar(r rune) bool {
	return r == '_' || isCat("L", unicode.L, r) || isCat("N", unicode.N, r) || unicode.Is(unicode.Other_Alphabetic, r)
}

func lastRune(s string) rune {
	r, _ := utf8.DecodeLastRuneInString(s)
	return r
}

func firstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}

// isCat reports membership in a general category as the reference regex
// engine sees it: Go's table plus the Unicode 16 additions.
func isCat(name string, tab *unicode.RangeTable, r rune) bool {
	if unicode.Is(tab, r) {
		return true
	}
	if add := unicodeAdditions[name]; add != nil && r > 0x7f {
		return unicode.Is(add, r)
	}
	return false
}

// augmentUnicodeClasses rewrites \p{X} in a regex so regexp2 (which uses
// Go's Unicode 15 tables) also matches the reference's Unicode 16 members:
// the extra ranges are appended as literal character ranges.
func augmentUnicodeClasses(p string) string {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			if (p[i+1] == 'p' || p[i+1] == 'P') && i+2 < len(p) && p[i+2] == '{' {
				if j := strings.IndexByte(p[i:], '}'); j > 0 {
					tok := p[i : i+j+1]
					name := p[i+3 : i+j]
					neg := p[i+1] == 'P'
					if tab := unicodeAdditions[name]; tab != nil && !(inClass && neg) {
						extra := literalRanges(tab)
						switch {
						case inClass:
							b.WriteString(tok + extra)
						case neg:
							b.WriteString(`[^\p{` + name + `}` + extra + `]`)
						default:
							b.WriteString(`[` + tok + extra + `]`)
						}
						i += j + 1
						continue
					}
				}
			}
			if cls := onigShorthand[p[i+1]]; cls.tab != nil && !(inClass && cls.neg) {
				// Oniguruma's \w and \d differ from .NET's (regexp2)
				r := literalRanges(cls.tab)
				if inClass {
					r = literalRanges(cls.inClass)
				}
				switch {
				case inClass:
					b.WriteString(r)
				case cls.neg:
					b.WriteString("[^" + r + "]")
				default:
					b.WriteString("[" + r + "]")
				}
				i += 2
				continue
			}
			_, n := utf8.DecodeRuneInString(p[i+1:])
			b.WriteString(p[i : i+1+n])
			i += 1 + n
			continue
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			i++
			if i < len(p) && p[i] == '^' {
				b.WriteByte('^')
				i++
			}
			if i < len(p) && p[i] == ']' { // a leading ] is literal
				b.WriteByte(']')
				i++
			}
			continue
		case c == ']' && inClass:
			inClass = false
		}
		b.WriteByte(c)
		i++
	}
	return b.String()
}

func literalRanges(t *unicode.RangeTable) string {
	var b strings.Builder
	w := func(lo, hi rune) {
		b.WriteRune(lo)
		if hi > lo {
			b.WriteByte('-')
			b.WriteRune(hi)
		}
	}
	for _, r := range t.R16 {
		w(rune(r.Lo), rune(r.Hi))
	}
	for _, r := range t.R32 {
		w(rune(r.Lo), rune(r.Hi))
	}
	return b.String()
}

// onigShorthand: Oniguruma's \w and \d, which (for Latin-1 code points)
// are not the same inside and outside a bracket class.
var onigShorthand = map[byte]struct {
	tab, inClass *unicode.RangeTable
	neg          bool
}{
	'w': {onigWord, onigWordInClass, false}, 'W': {onigWord, onigWordInClass, true},
	'd': {onigDigit, onigDigitInClass, false}, 'D': {onigDigit, onigDigitInClass, true},
}
