package tokenization

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlclark/regexp2"
)

// span is a half-open byte range.
type span struct{ start, end int }

// matcher finds all non-overlapping matches of a pattern, left to right, the
// way Oniguruma's find_iter does in HF tokenizers.
type matcher interface {
	findAll(s string, dst []span) ([]span, error)
	// local reports that a match found at position p does not depend on the
	// text before p (no look-behind, anchors or word boundaries), which is
	// what makes boundaries inside unmatched text reusable.
	local() bool
}

// regexMatchTimeout bounds a single regexp2 match call. Legitimate matches on
// the supported patterns take microseconds; only catastrophic backtracking
// would reach it, and then encoding fails with an error instead of hanging.
const regexMatchTimeout = 30 * time.Second

type regexp2Matcher struct {
	re      *regexp2.Regexp
	isLocal bool
	pool    sync.Pool // *runeBuf
}

type runeBuf struct {
	runes []rune
	offs  []int // byte offset of each rune, plus len(s)
}

// isLocalPattern reports whether pattern has none of the constructs that look
// at text before a match's start: look-behind, anchors (^ $ \A \z \Z \G) and
// word boundaries (\b \B). Inside a character class none of them is one: a
// leading ^ negates the class ([^\s\p{L}]) and \b is a backspace, so classes
// are skipped. It errs on the side of "non-local" (a nested class ends the
// skip at its first ]), which only costs boundaries, never exactness.
func isLocalPattern(pattern string) bool {
	inClass := false
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case c == '\\':
			i++
			if !inClass && i < len(pattern) && strings.IndexByte("bBAzZG", pattern[i]) >= 0 {
				return false
			}
		case inClass:
			inClass = c != ']'
		case c == '[':
			inClass = true
			if i+1 < len(pattern) && pattern[i+1] == '^' {
				i++
			}
			if i+1 < len(pattern) && pattern[i+1] == ']' { // a leading ] is literal
				i++
			}
		case c == '^' || c == '$':
			return false
		case strings.HasPrefix(pattern[i:], "(?<=") || strings.HasPrefix(pattern[i:], "(?<!"):
			return false
		}
	}
	return true
}

func newRegexp2Matcher(pattern string) (*regexp2Matcher, error) {
	re, err := regexp2.Compile(augmentUnicodeClasses(pattern), regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", pattern, err)
	}
	re.MatchTimeout = regexMatchTimeout
	m := &regexp2Matcher{re: re, isLocal: isLocalPattern(pattern)}
	m.pool.New = func() any { return new(runeBuf) }
	return m, nil
}

func (m *regexp2Matcher) local() bool { return m.isLocal }

func (m *regexp2Matcher) findAll(s string, dst []span) ([]span, error) {
	if s == "" {
		return dst, nil
	}
	rb := m.pool.Get().(*runeBuf)
	defer m.pool.Put(rb)
	rb.runes = rb.runes[:0]
	rb.offs = rb.offs[:0]
	for i, r := range s {
		rb.runes = append(rb.runes, r)
		rb.offs = append(rb.offs, i)
	}
	rb.offs = append(rb.offs, len(s))
	mt, err := m.re.FindRunesMatch(rb.runes)
	for err == nil && mt != nil {
		st := rb.offs[mt.Index]
		en := rb.offs[mt.Index+mt.Length]
		dst = append(dst, span{st, en})
		mt, err = m.re.FindNextMatch(mt)
	}
	if err != nil {
		return dst, fmt.Errorf("regex %q: %w", m.re.String(), err)
	}
	return dst, nil
}

// literalMatcher finds non-overlapping occurrences of a fixed string.
type literalMatcher struct{ lit string }

func (m literalMatcher) local() bool { return true }

func (m literalMatcher) findAll(s string, dst []span) ([]span, error) {
	if m.lit == "" {
		return dst, nil
	}
	off := 0
	for {
		i := strings.Index(s[off:], m.lit)
		if i < 0 {
			return dst, nil
		}
		dst = append(dst, span{off + i, off + i + len(m.lit)})
		off += i + len(m.lit)
	}
}

// compilePattern builds a matcher for an HF pattern object:
// {"String": "..."} or {"Regex": "..."}. Known pre-tokenizer regexes get a
// hand-written matcher proven equal to regexp2 by tests.
func compilePattern(p patternJSON) (matcher, error) {
	switch {
	case p.Regex != nil:
		if fm := fastMatcherFor(*p.Regex); fm != nil {
			return fm, nil
		}
		return newRegexp2Matcher(*p.Regex)
	case p.String != nil:
		return literalMatcher{lit: *p.String}, nil
	}
	return nil, fmt.Errorf("pattern has neither String nor Regex")
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}
