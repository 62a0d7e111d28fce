package jinja

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Python string helpers.

// IsPySpace reports whether r is whitespace for Python's str.isspace (the
// set str.strip removes) and the regular expression \s, which Jinja2's
// whitespace control uses: unicode.IsSpace plus U+001C..U+001F.
func IsPySpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x1680,
		0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// pyLower and pyUpper use Unicode's full case mappings, as Python's
// str.lower and str.upper do ("ß" upper-cases to "SS").
func pyLower(s string) string { return cases.Lower(language.Und).String(s) }

func pyUpper(s string) string { return cases.Upper(language.Und).String(s) }

// pyTitleRune is Python's title-casing of one character ("ﬁ" becomes "Fi").
func pyTitleRune(r rune) string { return cases.Title(language.Und).String(string(r)) }

func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }

// pyCapitalize is str.capitalize: the first character title-cased, the
// rest lower-cased.
func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	first, n := utf8.DecodeRuneInString(s)
	return pyTitleRune(first) + pyLower(s[n:])
}

// pyTitle is str.title(): a cased character after an uncased one is
// title-cased, other cased characters lower-cased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, c := range s {
		switch {
		case !isCased(c):
			b.WriteRune(c)
			prevCased = false
			continue
		case prevCased:
			b.WriteString(pyLower(string(c)))
		default:
			b.WriteString(pyTitleRune(c))
		}
		prevCased = true
	}
	return b.String()
}

func pyStrip(s, chars string, left, right bool) string {
	in := func(r rune) bool { return strings.ContainsRune(chars, r) }
	if left {
		s = strings.TrimLeftFunc(s, in)
	}
	if right {
		s = strings.TrimRightFunc(s, in)
	}
	return s
}

func pyReplace(s, old, repl string, n int) string {
	if len(repl) > len(old) {
		c := strings.Count(s, old)
		if old == "" {
			c = utf8.RuneCountInString(s) + 1
		}
		checkLen(len(s) + c*(len(repl)-len(old)))
	}
	if old == "" {
		// Python inserts repl between every character (and at both ends).
		rs := []rune(s)
		var b strings.Builder
		count := 0
		for i := 0; i <= len(rs); i++ {
			if n < 0 || count < n {
				b.WriteString(repl)
				count++
			}
			if i < len(rs) {
				b.WriteRune(rs[i])
			}
		}
		return b.String()
	}
	return strings.Replace(s, old, repl, n)
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for n != 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append(out, s[i+len(sep):])
		s = s[:i]
		n--
	}
	out = append(out, s)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func splitWhitespace(s string, n int, fromRight bool) []string {
	if n < 0 {
		f := strings.FieldsFunc(s, IsPySpace)
		if f == nil {
			f = []string{}
		}
		return f
	}
	if fromRight {
		var out []string
		s = strings.TrimRightFunc(s, IsPySpace)
		for n > 0 && s != "" {
			i := strings.LastIndexFunc(s, IsPySpace)
			if i < 0 {
				break
			}
			_, w := utf8.DecodeRuneInString(s[i:])
			out = append(out, s[i+w:])
			s = strings.TrimRightFunc(s[:i], IsPySpace)
			n--
		}
		if s != "" {
			out = append(out, s)
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	out := []string{}
	s = strings.TrimLeftFunc(s, IsPySpace)
	for n > 0 && s != "" {
		i := strings.IndexFunc(s, IsPySpace)
		if i < 0 {
			break
		}
		out = append(out, s[:i])
		s = strings.TrimLeftFunc(s[i:], IsPySpace)
		n--
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// pySplitLines is str.splitlines() for the line breaks Python knows.
func pySplitLines(s string) []string {
	var out []string
	start := 0
	rs := []rune(s)
	b := 0
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		w := utf8.RuneLen(c)
		switch c {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029, '\r':
			out = append(out, s[start:b])
			if c == '\r' && i+1 < len(rs) && rs[i+1] == '\n' {
				i++
				b++
			}
			b += w
			start = b
			continue
		}
		b += w
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// pyPercent is the "%s" / "%d" subset of Python's % formatting (jinja's
// format filter).
func pyPercent(f string, args []any) string {
	var b strings.Builder
	ai := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case '%':
			b.WriteByte('%')
		case 's', 'd', 'r':
			if ai >= len(args) {
				throw("not enough arguments for format string")
			}
			a := args[ai]
			ai++
			switch f[i] {
			case 's':
				b.WriteString(toStr(a))
			case 'r':
				b.WriteString(reprString(a))
			default:
				n, ok := num(a)
				if !ok {
					throw("%%d format: a real number is required, not %s", typeName(a))
				}
				b.WriteString(strconv.FormatInt(int64(n), 10))
			}
		default:
			throw("unsupported format character '%c'", f[i])
		}
	}
	if ai < len(args) {
		throw("not all arguments converted during string formatting")
	}
	return b.String()
}
