package jinja

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// tokKind is the kind of a lexer token.
type tokKind int

const (
	tkEOF tokKind = iota
	tkData
	tkBlockBegin
	tkBlockEnd
	tkVarBegin
	tkVarEnd
	tkName
	tkString
	tkInt
	tkFloat
	tkOp
)

type token struct {
	kind tokKind
	val  string
	line int
}

func (t token) String() string {
	switch t.kind {
	case tkEOF:
		return "end of template"
	case tkData:
		return "template data"
	case tkBlockBegin:
		return "'{%'"
	case tkBlockEnd:
		return "'%}'"
	case tkVarBegin:
		return "'{{'"
	case tkVarEnd:
		return "'}}'"
	}
	return fmt.Sprintf("%q", t.val)
}

func trimRightPySpace(s string) string { return strings.TrimRightFunc(s, IsPySpace) }

func trimLeftPySpace(s string) string { return strings.TrimLeftFunc(s, IsPySpace) }

// normalizeNewlines turns \r\n and \r into \n, as Jinja2 does before lexing.
func normalizeNewlines(s string) string {
	if !strings.Contains(s, "\r") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// lexer splits a template into tokens with the whitespace rules of
// transformers' environment: trim_blocks and lstrip_blocks on, and the
// "-" / "+" markers on tags.
type lexer struct {
	src          string
	pos          int
	line         int
	toks         []token
	lineStarting bool
}

func lex(src string) ([]token, error) {
	src = normalizeNewlines(src)
	// keep_trailing_newline is off: one trailing newline is dropped.
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1, lineStarting: true}
	if err := lx.run(); err != nil {
		return nil, err
	}
	lx.toks = append(lx.toks, token{kind: tkEOF, line: lx.line})
	return lx.toks, nil
}

func (lx *lexer) errorf(format string, args ...any) error {
	return &SyntaxError{Line: lx.line, Msg: fmt.Sprintf(format, args...)}
}

func (lx *lexer) emit(k tokKind, v string) {
	lx.toks = append(lx.toks, token{kind: k, val: v, line: lx.line})
	lx.line += strings.Count(v, "\n")
}

// nextTag finds the next "{%", "{{" or "{#" at or after pos.
func (lx *lexer) nextTag(from int) int {
	for i := from; ; {
		j := strings.IndexByte(lx.src[i:], '{')
		if j < 0 || i+j+1 >= len(lx.src) {
			return -1
		}
		c := lx.src[i+j+1]
		if c == '%' || c == '{' || c == '#' {
			return i + j
		}
		i += j + 1
	}
}

func (lx *lexer) run() error {
	for lx.pos < len(lx.src) {
		at := lx.nextTag(lx.pos)
		if at < 0 {
			lx.emit(tkData, lx.src[lx.pos:])
			lx.pos = len(lx.src)
			return nil
		}
		text := lx.src[lx.pos:at]
		kind := lx.src[at+1]
		sign := byte(0)
		if at+2 < len(lx.src) && (lx.src[at+2] == '-' || lx.src[at+2] == '+') {
			sign = lx.src[at+2]
		}
		isRaw := false
		if kind == '%' {
			isRaw = lx.rawAt(at)
		}
		switch {
		case sign == '-':
			text = trimRightPySpace(text)
		case sign != '+' && kind != '{':
			lpos := strings.LastIndexByte(text, '\n') + 1
			if lpos > 0 || lx.lineStarting {
				rest := text[lpos:]
				if rest != "" && strings.TrimLeftFunc(rest, IsPySpace) == "" {
					text = text[:lpos]
				}
			}
		}
		if text != "" {
			lx.emit(tkData, text)
		}
		// Count the newlines of stripped whitespace too.
		lx.line += strings.Count(lx.src[lx.pos:at], "\n") - strings.Count(text, "\n")
		lx.pos = at + 2
		if sign != 0 {
			lx.pos++
		}
		var err error
		switch {
		case isRaw:
			err = lx.lexRaw()
		case kind == '#':
			err = lx.lexComment()
		case kind == '%':
			lx.emit(tkBlockBegin, "{%")
			err = lx.lexInside("%}")
		default:
			lx.emit(tkVarBegin, "{{")
			err = lx.lexInside("}}")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// rawAt reports whether the block tag at i is {% raw %}.
func (lx *lexer) rawAt(i int) bool {
	s := lx.src[i+2:]
	if s != "" && (s[0] == '-' || s[0] == '+') {
		s = s[1:]
	}
	s = trimLeftPySpace(s)
	if !strings.HasPrefix(s, "raw") {
		return false
	}
	s = trimLeftPySpace(s[3:])
	return strings.HasPrefix(s, "%}") || strings.HasPrefix(s, "-%}")
}

// afterEnd consumes a closing tag's whitespace control: "-X" strips all
// following whitespace, "+X" nothing, a plain block or comment end one
// newline (trim_blocks).
func (lx *lexer) afterEnd(minus, plus, block bool) {
	switch {
	case minus:
		rest := trimLeftPySpace(lx.src[lx.pos:])
		lx.line += strings.Count(lx.src[lx.pos:len(lx.src)-len(rest)], "\n")
		lx.pos = len(lx.src) - len(rest)
		lx.lineStarting = false
		if lx.pos > 0 && lx.src[lx.pos-1] == '\n' {
			lx.lineStarting = true
		}
	case !plus && block && lx.pos < len(lx.src) && lx.src[lx.pos] == '\n':
		lx.pos++
		lx.line++
		lx.lineStarting = true
	default:
		lx.lineStarting = false
	}
}

func (lx *lexer) lexRaw() error {
	// Skip "raw" and the tag end.
	end := strings.Index(lx.src[lx.pos:], "%}")
	minus := lx.src[lx.pos+end-1] == '-'
	lx.pos += end + 2
	if minus {
		lx.afterEnd(true, false, true)
	}
	// Find {% endraw %}.
	for i := lx.pos; ; {
		j := strings.Index(lx.src[i:], "{%")
		if j < 0 {
			return lx.errorf("missing end of raw directive")
		}
		at := i + j
		s := lx.src[at+2:]
		sign := byte(0)
		if s != "" && (s[0] == '-' || s[0] == '+') {
			sign = s[0]
			s = s[1:]
		}
		t := trimLeftPySpace(s)
		if strings.HasPrefix(t, "endraw") {
			t2 := trimLeftPySpace(t[6:])
			var emin, eplus bool
			switch {
			case strings.HasPrefix(t2, "-%}"):
				emin = true
			case strings.HasPrefix(t2, "+%}"):
				eplus = true
			case strings.HasPrefix(t2, "%}"):
			default:
				i = at + 2
				continue
			}
			text := lx.src[lx.pos:at]
			if sign == '-' {
				text = trimRightPySpace(text)
			} else if sign != '+' {
				lpos := strings.LastIndexByte(text, '\n') + 1
				rest := text[lpos:]
				if (lpos > 0 || lx.lineStarting) && rest != "" && strings.TrimLeftFunc(rest, IsPySpace) == "" {
					text = text[:lpos]
				}
			}
			if text != "" {
				lx.emit(tkData, text)
			}
			lx.line += strings.Count(lx.src[lx.pos:at], "\n") - strings.Count(text, "\n")
			lx.pos = len(lx.src) - len(t2)
			if emin || eplus {
				lx.pos++
			}
			lx.pos += 2
			lx.afterEnd(emin, eplus, true)
			return nil
		}
		i = at + 2
	}
}

func (lx *lexer) lexComment() error {
	j := strings.Index(lx.src[lx.pos:], "#}")
	if j < 0 {
		return lx.errorf("missing end of comment tag")
	}
	at := lx.pos + j
	minus := at > lx.pos && lx.src[at-1] == '-'
	plus := at > lx.pos && lx.src[at-1] == '+'
	lx.line += strings.Count(lx.src[lx.pos:at], "\n")
	lx.pos = at + 2
	lx.afterEnd(minus, plus, true)
	return nil
}

var operators2 = []string{"//", "**", "==", "!=", "<=", ">="}

const operators1 = "+-/*%~[](){}<>=.,:|"

// lexInside tokenizes an expression up to the closing "%}" or "}}" (closer),
// which only counts while brackets are balanced, as in Jinja2.
func (lx *lexer) lexInside(closer string) error {
	var stack []byte
	for {
		// Skip whitespace.
		for lx.pos < len(lx.src) {
			r, n := utf8.DecodeRuneInString(lx.src[lx.pos:])
			if !IsPySpace(r) {
				break
			}
			if r == '\n' {
				lx.line++
			}
			lx.pos += n
		}
		if lx.pos >= len(lx.src) {
			return lx.errorf("unexpected end of template, expected %q", closer)
		}
		s := lx.src[lx.pos:]
		if len(stack) == 0 {
			switch {
			case strings.HasPrefix(s, "-"+closer):
				lx.emitEnd(closer)
				lx.pos += 3
				lx.afterEnd(true, false, closer == "%}")
				return nil
			case closer == "%}" && strings.HasPrefix(s, "+%}"):
				lx.emitEnd(closer)
				lx.pos += 3
				lx.afterEnd(false, true, true)
				return nil
			case strings.HasPrefix(s, closer):
				lx.emitEnd(closer)
				lx.pos += 2
				lx.afterEnd(false, false, closer == "%}")
				return nil
			}
		}
		c := s[0]
		switch {
		case c == '"' || c == '\'':
			v, n, err := lexString(s)
			if err != nil {
				return lx.errorf("%v", err)
			}
			lx.emit(tkString, v)
			lx.line += strings.Count(s[:n], "\n") - strings.Count(v, "\n")
			lx.pos += n
		case c >= '0' && c <= '9':
			n, isFloat := lexNumber(s)
			k := tkInt
			if isFloat {
				k = tkFloat
			}
			lx.emit(k, strings.ReplaceAll(s[:n], "_", ""))
			lx.pos += n
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			n := 0
			for n < len(s) {
				r, sz := utf8.DecodeRuneInString(s[n:])
				if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || (r >= 0x80 && isIdentRune(r)) {
					n += sz
					continue
				}
				break
			}
			if n == 0 {
				return lx.errorf("unexpected char %q", s[:1])
			}
			lx.emit(tkName, s[:n])
			lx.pos += n
		default:
			op := ""
			for _, o := range operators2 {
				if strings.HasPrefix(s, o) {
					op = o
					break
				}
			}
			if op == "" && strings.IndexByte(operators1, c) >= 0 {
				op = s[:1]
			}
			if op == "" {
				return lx.errorf("unexpected char %q", s[:1])
			}
			switch op {
			case "(", "[", "{":
				stack = append(stack, op[0])
			case ")", "]", "}":
				want := map[string]byte{")": '(', "]": '[', "}": '{'}[op]
				if len(stack) == 0 || stack[len(stack)-1] != want {
					return lx.errorf("unexpected %q", op)
				}
				stack = stack[:len(stack)-1]
			}
			lx.emit(tkOp, op)
			lx.pos += len(op)
		}
	}
}

func (lx *lexer) emitEnd(closer string) {
	if closer == "%}" {
		lx.emit(tkBlockEnd, closer)
	} else {
		lx.emit(tkVarEnd, closer)
	}
}

func isIdentRune(r rune) bool {
	return r > 0x7f && !IsPySpace(r) && !strings.ContainsRune(operators1, r)
}

func lexNumber(s string) (n int, isFloat bool) {
	digits := func(i int) int {
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '_') {
			i++
		}
		return i
	}
	n = digits(0)
	if n+1 < len(s) && s[n] == '.' && s[n+1] >= '0' && s[n+1] <= '9' {
		isFloat = true
		n = digits(n + 1)
	}
	if n < len(s) && (s[n] == 'e' || s[n] == 'E') {
		i := n + 1
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i < len(s) && s[i] >= '0' && s[i] <= '9' {
			isFloat = true
			n = digits(i)
		}
	}
	return n, isFloat
}

// lexString decodes a quoted string literal with Python's escape rules, as
// Jinja2 does (unicode-escape). It returns the value and the literal's length.
func lexString(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	i := 1
	for i < len(s) {
		c := s[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' {
			r, n := utf8.DecodeRuneInString(s[i:])
			b.WriteRune(r)
			i += n
			continue
		}
		if i+1 >= len(s) {
			break
		}
		e := s[i+1]
		i += 2
		switch e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case 'x', 'u', 'U':
			w := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+w > len(s) {
				return "", 0, fmt.Errorf("truncated \\%c escape", e)
			}
			var r rune
			for _, h := range s[i : i+w] {
				d := hexVal(h)
				if d < 0 {
					return "", 0, fmt.Errorf("bad \\%c escape", e)
				}
				r = r*16 + rune(d)
			}
			if r > utf8.MaxRune {
				return "", 0, fmt.Errorf("bad \\%c escape", e)
			}
			b.WriteRune(r)
			i += w
		case '0', '1', '2', '3', '4', '5', '6', '7':
			r := rune(e - '0')
			for k := 0; k < 2 && i < len(s) && s[i] >= '0' && s[i] <= '7'; k++ {
				r = r*8 + rune(s[i]-'0')
				i++
			}
			b.WriteRune(r)
		default:
			// Python keeps unknown escapes as written.
			b.WriteByte('\\')
			i--
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

func hexVal(r rune) int {
	switch {
	case r >= '0' && r <= '9':
		return int(r - '0')
	case r >= 'a' && r <= 'f':
		return int(r-'a') + 10
	case r >= 'A' && r <= 'F':
		return int(r-'A') + 10
	}
	return -1
}
