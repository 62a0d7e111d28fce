package jinja

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// FromJSON decodes JSON into template values, keeping object key order
// (a repeated key keeps its first position and last value, like Python's
// json.loads) and Python's int/float distinction (a number without '.',
// 'e' or 'E' is an int). Invalid UTF-8 and lone surrogate escapes become
// U+FFFD, as encoding/json does.
func FromJSON(data []byte) (any, error) {
	d := &jsonDecoder{s: data}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.space()
	if d.i != len(d.s) {
		return nil, d.errorf("trailing data after the JSON value")
	}
	return v, nil
}

const maxJSONDepth = 1000

type jsonDecoder struct {
	s []byte
	i int
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", d.i, fmt.Sprintf(format, args...))
}

func (d *jsonDecoder) space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, d.errorf("nested deeper than %d", maxJSONDepth)
	}
	if d.i >= len(d.s) {
		return nil, d.errorf("unexpected end of input")
	}
	switch c := d.s[d.i]; {
	case c == '{':
		d.i++
		obj := NewDict()
		d.space()
		if d.i < len(d.s) && d.s[d.i] == '}' {
			d.i++
			return obj, nil
		}
		for {
			d.space()
			if d.i >= len(d.s) || d.s[d.i] != '"' {
				return nil, d.errorf("expected a string key")
			}
			k, err := d.str()
			if err != nil {
				return nil, err
			}
			d.space()
			if d.i >= len(d.s) || d.s[d.i] != ':' {
				return nil, d.errorf("expected ':'")
			}
			d.i++
			d.space()
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			_ = obj.Set(k, v)
			d.space()
			if d.i >= len(d.s) {
				return nil, d.errorf("unexpected end of input")
			}
			if d.s[d.i] == '}' {
				d.i++
				return obj, nil
			}
			if d.s[d.i] != ',' {
				return nil, d.errorf("expected ',' or '}'")
			}
			d.i++
		}
	case c == '[':
		d.i++
		l := &ListVal{}
		d.space()
		if d.i < len(d.s) && d.s[d.i] == ']' {
			d.i++
			return l, nil
		}
		for {
			d.space()
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			l.Items = append(l.Items, v)
			d.space()
			if d.i >= len(d.s) {
				return nil, d.errorf("unexpected end of input")
			}
			if d.s[d.i] == ']' {
				d.i++
				return l, nil
			}
			if d.s[d.i] != ',' {
				return nil, d.errorf("expected ',' or ']'")
			}
			d.i++
		}
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	default:
		for _, lit := range []struct {
			text string
			val  any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if strings.HasPrefix(string(d.s[d.i:min(len(d.s), d.i+len(lit.text))]), lit.text) {
				d.i += len(lit.text)
				return lit.val, nil
			}
		}
		return nil, d.errorf("unexpected character %q", c)
	}
}

func (d *jsonDecoder) number() (any, error) {
	start := d.i
	if d.s[d.i] == '-' {
		d.i++
	}
	digits := func() int {
		n := 0
		for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	intStart := d.i
	if digits() == 0 {
		return nil, d.errorf("bad number")
	}
	if d.s[intStart] == '0' && d.i-intStart > 1 {
		return nil, d.errorf("number with a leading zero")
	}
	isFloat := false
	if d.i < len(d.s) && d.s[d.i] == '.' {
		d.i++
		isFloat = true
		if digits() == 0 {
			return nil, d.errorf("bad number")
		}
	}
	if d.i < len(d.s) && (d.s[d.i] == 'e' || d.s[d.i] == 'E') {
		d.i++
		isFloat = true
		if d.i < len(d.s) && (d.s[d.i] == '+' || d.s[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return nil, d.errorf("bad number")
		}
	}
	text := string(d.s[start:d.i])
	if !isFloat {
		if v, err := strconv.ParseInt(text, 10, 64); err == nil {
			return v, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, d.errorf("bad number %s", text)
	}
	if err != nil {
		// Python keeps big integers exact; we cannot, so refuse rather than
		// render a different number.
		return nil, d.errorf("number %s out of range", text)
	}
	if !isFloat {
		return nil, d.errorf("integer %s does not fit in 64 bits", text)
	}
	return f, nil
}

func (d *jsonDecoder) str() (string, error) {
	d.i++ // opening quote
	start := d.i
	// Fast path: no escapes, valid UTF-8.
	for d.i < len(d.s) {
		c := d.s[d.i]
		if c == '"' {
			s := d.s[start:d.i]
			d.i++
			if utf8.Valid(s) {
				return string(s), nil
			}
			return fixUTF8(s), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", d.errorf("control character in string")
		}
		d.i++
	}
	var b strings.Builder
	b.WriteString(fixUTF8(d.s[start:d.i]))
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return b.String(), nil
		case c < 0x20:
			return "", d.errorf("control character in string")
		case c != '\\':
			j := d.i
			for j < len(d.s) && d.s[j] != '"' && d.s[j] != '\\' && d.s[j] >= 0x20 {
				j++
			}
			b.WriteString(fixUTF8(d.s[d.i:j]))
			d.i = j
			continue
		}
		if d.i+1 >= len(d.s) {
			break
		}
		e := d.s[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return "", d.errorf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if d.i+1 < len(d.s) && d.s[d.i] == '\\' && d.s[d.i+1] == 'u' {
					save := d.i
					d.i += 2
					if lo, ok := d.hex4(); ok {
						if dec := utf16.DecodeRune(r, lo); dec != utf8.RuneError {
							r2 = dec
						} else {
							d.i = save
						}
					} else {
						d.i = save
					}
				}
				r = r2
			}
			b.WriteRune(r)
		default:
			return "", d.errorf("bad escape \\%c", e)
		}
	}
	return "", d.errorf("unterminated string")
}

func (d *jsonDecoder) hex4() (rune, bool) {
	if d.i+4 > len(d.s) {
		return 0, false
	}
	var r rune
	for _, h := range d.s[d.i : d.i+4] {
		v := hexVal(rune(h))
		if v < 0 {
			return 0, false
		}
		r = r*16 + rune(v)
	}
	d.i += 4
	return r, true
}

// fixUTF8 replaces each invalid byte with U+FFFD, as encoding/json does.
func fixUTF8(s []byte) string {
	if utf8.Valid(s) {
		return string(s)
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.Write(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}
