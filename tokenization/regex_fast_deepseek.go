package tokenization

import (
	"unicode"
	"unicode/utf8"
)

// Fast matchers for the DeepSeek-V3 pre-tokenizer sequence (same contract as
// regex_fast.go: exact Oniguruma semantics, checked against regexp2).
const (
	digits3Pattern     = `\p{N}{1,3}`
	cjkRunPattern      = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	deepseekPattern    = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	asciiPunctForAlpha = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
)

func init() {
	extraFastMatchers = map[string]func() matcher{
		digits3Pattern:  func() matcher { return digitsMatcher{max: 3} },
		cjkRunPattern:   func() matcher { return cjkRunMatcher{} },
		deepseekPattern: func() matcher { return deepseekMatcher{} },
	}
}

// digitsMatcher: \p{N}{1,max}
type digitsMatcher struct{ max int }

func (digitsMatcher) local() bool { return true }

func (d digitsMatcher) findAll(s string, dst []span) ([]span, error) {
	for i := 0; i < len(s); {
		_, c, n := runeAt(s, i)
		if c&clN == 0 {
			i += n
			continue
		}
		e, k := i+n, 1
		for ; k < d.max && e < len(s); k++ {
			_, c2, n2 := runeAt(s, e)
			if c2&clN == 0 {
				break
			}
			e += n2
		}
		dst = append(dst, span{i, e})
		i = e
	}
	return dst, nil
}

// cjkRunMatcher: [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
type cjkRunMatcher struct{}

func (cjkRunMatcher) local() bool { return true }

func isCJKRun(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

func (cjkRunMatcher) findAll(s string, dst []span) ([]span, error) {
	start := -1
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			if start >= 0 {
				dst = append(dst, span{start, i})
				start = -1
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if isCJKRun(r) {
			if start < 0 {
				start = i
			}
		} else if start >= 0 {
			dst = append(dst, span{start, i})
			start = -1
		}
		i += n
	}
	if start >= 0 {
		dst = append(dst, span{start, len(s)})
	}
	return dst, nil
}

const (
	dsL = 1 << iota
	dsM
	dsP
	dsSym
	dsSpace
	dsRN
)

var dsASCII [128]uint8

func init() {
	for r := 0; r < 128; r++ {
		dsASCII[r] = dsClassSlow(rune(r))
	}
}

func dsClassSlow(r rune) uint8 {
	var c uint8
	switch {
	case isCat("L", unicode.L, r):
		c = dsL
	case isCat("M", unicode.M, r):
		c = dsM
	case isCat("P", unicode.P, r):
		c = dsP
	case isCat("S", unicode.S, r):
		c = dsSym
	}
	if unicode.IsSpace(r) {
		c |= dsSpace
	}
	if r == '\r' || r == '\n' {
		c |= dsRN
	}
	return c
}

func dsAt(s string, i int) (rune, uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), dsASCII[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, dsClassSlow(r), n
}

func dsRun(s string, i int, mask uint8) int {
	for i < len(s) {
		_, c, n := dsAt(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}

type deepseekMatcher struct{}

func (deepseekMatcher) local() bool { return true }

func (m deepseekMatcher) findAll(s string, dst []span) ([]span, error) {
	return scanMatches(s, dst, m.matchAt), nil
}

func isASCIIAlpha(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

func (deepseekMatcher) matchAt(s string, i int) int {
	r, c, n := dsAt(s, i)
	// [ASCII punctuation][A-Za-z]+
	if r < utf8.RuneSelf && i+1 < len(s) && isASCIIAlpha(s[i+1]) && isASCIIPunct(byte(r)) {
		e := i + 2
		for e < len(s) && isASCIIAlpha(s[e]) {
			e++
		}
		return e
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c&dsL != 0 {
		return dsRun(s, i+n, dsL|dsM)
	}
	if c&(dsRN|dsP|dsSym) == 0 {
		if e := dsRun(s, i+n, dsL|dsM); e > i+n || c&dsM != 0 {
			return e
		}
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	k := i
	if r == ' ' {
		k = i + 1
	}
	if e := dsRun(s, k, dsP|dsSym); e > k {
		return dsRun(s, e, dsRN)
	}
	if c&dsSpace != 0 {
		return whitespace(s, i, true)
	}
	return i
}

func isASCIIPunct(b byte) bool {
	for i := 0; i < len(asciiPunctForAlpha); i++ {
		if asciiPunctForAlpha[i] == b {
			return true
		}
	}
	return false
}
