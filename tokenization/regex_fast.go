package tokenization

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written matchers for the pre-tokenizer regexes of the GPT-2,
// Llama-3 and Qwen2/3 families. They implement exactly what Oniguruma's
// backtracking does for these patterns (leftmost alternative first, greedy
// quantifiers, backtracking inside an alternative) in one forward pass, and
// are checked against regexp2 by TestFastMatchersEqualRegexp2 and
// FuzzFastMatchers. regexp2 stays the general fallback.

// Patterns as they appear in tokenizer.json (after JSON decoding).
const (
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

func fastMatcherFor(pattern string) matcher {
	switch pattern {
	case qwen2Pattern:
		return &llama3Matcher{maxDigits: 1}
	case llama3Pattern:
		return &llama3Matcher{maxDigits: 3}
	case gpt2Pattern:
		return gpt2Matcher{}
	}
	if mk := extraFastMatchers[pattern]; mk != nil {
		return mk()
	}
	return nil
}

// extraFastMatchers holds the other families' matchers (set in init).
var extraFastMatchers map[string]func() matcher

const (
	clL  = 1 << iota // \p{L}
	clN              // \p{N}
	clS              // \s
	clRN             // \r or \n
)

var asciiClass [128]uint8

func init() {
	for r := 0; r < 128; r++ {
		asciiClass[r] = classOfSlow(rune(r))
	}
}

func classOfSlow(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clS | clRN
	case isCat("L", unicode.L, r):
		return clL
	case isCat("N", unicode.N, r):
		return clN
	case unicode.IsSpace(r):
		return clS
	}
	return 0
}

// runeAt decodes the rune at i (invalid UTF-8 decodes as U+FFFD, width 1,
// as regexp2's string-to-runes conversion does).
func runeAt(s string, i int) (rune, uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, classOfSlow(r), n
}

// runOf returns the end of the run of runes starting at i whose class
// satisfies ok.
func runOf(s string, i int, ok func(uint8) bool) int {
	for i < len(s) {
		_, c, n := runeAt(s, i)
		if !ok(c) {
			break
		}
		i += n
	}
	return i
}

func isLetterClass(c uint8) bool { return c&clL != 0 }
func isNumberClass(c uint8) bool { return c&clN != 0 }
func isSpaceClass(c uint8) bool  { return c&clS != 0 }
func isOtherClass(c uint8) bool  { return c&(clL|clN|clS) == 0 } // [^\s\p{L}\p{N}]
func isCRLFClass(c uint8) bool   { return c&clRN != 0 }

// whitespace handles the trailing alternatives shared by the patterns:
// [\s*[\r\n]+ |] \s+(?!\S) | \s+ at i (s[i] is whitespace).
func whitespace(s string, i int, crlf bool) int {
	j := runOf(s, i, isSpaceClass)
	if crlf {
		// \s*[\r\n]+: \s* backtracks to the last \r or \n of the run
		for p := j - 1; p >= i; p-- {
			if s[p] == '\r' || s[p] == '\n' {
				return p + 1
			}
		}
	}
	if j == len(s) {
		return j
	}
	// \s+(?!\S): give back the last whitespace rune if one remains
	_, last := utf8.DecodeLastRuneInString(s[i:j])
	if j-last > i {
		return j - last
	}
	return j // \s+
}

// scanMatches is findAll for a hand-written matcher: matchAt returns the end
// of the match at i, or i when no alternative matches there, and then the
// scan moves on by one character as Oniguruma's does.
func scanMatches(s string, dst []span, matchAt func(s string, i int) int) []span {
	for i := 0; i < len(s); {
		e := matchAt(s, i)
		if e <= i {
			_, n := utf8.DecodeRuneInString(s[i:])
			i += n
			continue
		}
		dst = append(dst, span{i, e})
		i = e
	}
	return dst
}

type llama3Matcher struct{ maxDigits int }

func (*llama3Matcher) local() bool { return true }

func (m *llama3Matcher) findAll(s string, dst []span) ([]span, error) {
	return scanMatches(s, dst, m.matchAt), nil
}

func (m *llama3Matcher) matchAt(s string, i int) int {
	r, c, n := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' && i+1 < len(s) {
		switch s[i+1] | 0x20 {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(s) && s[i+2]|0x20 == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(s) && s[i+2]|0x20 == 'l' {
				return i + 3
			}
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&clL != 0 {
		return runOf(s, i+n, isLetterClass)
	}
	if c&(clN|clRN) == 0 {
		if e := runOf(s, i+n, isLetterClass); e > i+n {
			return e
		}
	}
	// \p{N} or \p{N}{1,3}
	if c&clN != 0 {
		e := i + n
		for k := 1; k < m.maxDigits && e < len(s); k++ {
			_, c2, n2 := runeAt(s, e)
			if c2&clN == 0 {
				break
			}
			e += n2
		}
		return e
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	k := i
	if r == ' ' {
		k = i + 1
	}
	if e := runOf(s, k, isOtherClass); e > k {
		return runOf(s, e, isCRLFClass)
	}
	if c&clS != 0 {
		return whitespace(s, i, true)
	}
	return i
}

// gpt2Matcher: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
type gpt2Matcher struct{}

func (gpt2Matcher) local() bool { return true }

func (m gpt2Matcher) findAll(s string, dst []span) ([]span, error) {
	return scanMatches(s, dst, m.matchAt), nil
}

func (gpt2Matcher) matchAt(s string, i int) int {
	r, c, _ := runeAt(s, i)
	if r == '\'' && i+1 < len(s) {
		switch s[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(s) && s[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(s) && s[i+2] == 'l' {
				return i + 3
			}
		}
	}
	k := i
	if r == ' ' {
		k = i + 1
	}
	for _, ok := range [...]func(uint8) bool{isLetterClass, isNumberClass, isOtherClass} {
		if e := runOf(s, k, ok); e > k {
			return e
		}
	}
	if c&clS != 0 {
		return whitespace(s, i, false)
	}
	return i
}
