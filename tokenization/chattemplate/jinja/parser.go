package jinja

import "fmt"

type parser struct {
	toks  []token
	pos   int
	depth int
}

// maxNesting bounds how deeply expressions and blocks nest, so a hostile
// template cannot exhaust the stack of the parser or the renderer.
const maxNesting = 256

func (p *parser) enter() {
	p.depth++
	if p.depth > maxNesting {
		p.fail("template nested more than %d levels deep", maxNesting)
	}
}

func (p *parser) leave() { p.depth-- }

// parseError carries a load-time error through the recursive-descent
// parser to Parse, which recovers it (the style of text/template/parse).
type parseError struct{ err error }

func (p *parser) fail(format string, args ...any) {
	panic(parseError{&SyntaxError{Line: p.cur().line, Msg: fmt.Sprintf(format, args...)}})
}

func (p *parser) unsupported(feature string) {
	panic(parseError{&UnsupportedError{Line: p.cur().line, Feature: feature}})
}

func (p *parser) cur() token { return p.toks[p.pos] }

func (p *parser) peek() token { return p.toks[min(p.pos+1, len(p.toks)-1)] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) isOp(op string) bool { t := p.cur(); return t.kind == tkOp && t.val == op }

func (p *parser) isName(n string) bool { t := p.cur(); return t.kind == tkName && t.val == n }

func (p *parser) skipOp(op string) bool {
	if !p.isOp(op) {
		return false
	}
	p.next()
	return true
}

func (p *parser) expectOp(op string) {
	if !p.isOp(op) {
		p.fail("expected %q, got %s", op, p.cur())
	}
	p.next()
}

func (p *parser) expectName() string {
	t := p.cur()
	if t.kind != tkName {
		p.fail("expected a name, got %s", t)
	}
	p.next()
	return t.val
}

func (p *parser) expectBlockEnd() {
	if p.cur().kind != tkBlockEnd {
		p.fail("expected end of statement block, got %s", p.cur())
	}
	p.next()
}

// parseBody parses nodes until a block tag whose name is one of ends; it
// returns that name, leaving the parser just after the tag name.
func (p *parser) parseBody(ends ...string) ([]Node, string) {
	p.enter()
	defer p.leave()
	var out []Node
	for {
		t := p.cur()
		switch t.kind {
		case tkEOF:
			if len(ends) > 0 {
				p.fail("unexpected end of template, expected %q", ends[0])
			}
			return out, ""
		case tkData:
			p.next()
			out = append(out, &Output{Text: t.val})
		case tkVarBegin:
			p.next()
			e := p.parseTuple(true)
			if p.cur().kind != tkVarEnd {
				p.fail("expected end of print statement, got %s", p.cur())
			}
			p.next()
			out = append(out, &Output{Expr: e})
		case tkBlockBegin:
			p.next()
			name := p.cur()
			if name.kind != tkName {
				p.fail("expected a statement name, got %s", name)
			}
			for _, e := range ends {
				if name.val == e {
					p.next()
					return out, e
				}
			}
			if n := p.parseStatement(); n != nil {
				out = append(out, n)
			}
		default:
			p.fail("unexpected %s", t)
		}
	}
}
