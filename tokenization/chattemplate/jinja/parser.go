package jinja

import (
	"fmt"
	"strconv"
)

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

func (p *parser) cur() token  { return p.toks[p.pos] }
func (p *parser) peek() token { return p.toks[min(p.pos+1, len(p.toks)-1)] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) isOp(op string) bool  { t := p.cur(); return t.kind == tkOp && t.val == op }
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

func (p *parser) parseStatement() Node {
	name := p.next().val
	switch name {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		fs := p.parseFilterChain(nil)
		p.expectBlockEnd()
		body, _ := p.parseBody("endfilter")
		p.expectBlockEnd()
		return &FilterBlock{Filters: fs, Body: body}
	case "with":
		return p.parseWith()
	case "generation":
		p.expectBlockEnd()
		body, _ := p.parseBody("endgeneration")
		p.expectBlockEnd()
		return &Generation{Body: body}
	case "break":
		p.expectBlockEnd()
		return &Break{}
	case "continue":
		p.expectBlockEnd()
		return &Continue{}
	case "block", "extends", "include", "import", "from", "do", "autoescape", "trans", "pluralize":
		p.pos--
		p.unsupported("the {% " + name + " %} tag")
	}
	p.pos--
	p.fail("unknown tag %q", name)
	return nil
}

func (p *parser) parseIf() Node {
	p.enter()
	defer p.leave()
	n := &If{Cond: p.parseTuple(false)}
	p.expectBlockEnd()
	body, end := p.parseBody("elif", "else", "endif")
	n.Body = body
	switch end {
	case "elif":
		n.Else = []Node{p.parseIf()}
		return n
	case "else":
		p.expectBlockEnd()
		n.Else, _ = p.parseBody("endif")
	}
	p.expectBlockEnd()
	return n
}

func (p *parser) parseFor() Node {
	n := &For{Target: p.parseAssignTarget(false)}
	if !p.isName("in") {
		p.fail("expected 'in', got %s", p.cur())
	}
	p.next()
	n.Iter = p.parseTupleNoCond()
	if p.isName("if") {
		p.next()
		n.Filter = p.parseExpr(true)
	}
	if p.isName("recursive") {
		p.unsupported("recursive for loops")
	}
	p.expectBlockEnd()
	body, end := p.parseBody("endfor", "else")
	n.Body = body
	if end == "else" {
		p.expectBlockEnd()
		n.Else, _ = p.parseBody("endfor")
	}
	p.expectBlockEnd()
	return n
}

func (p *parser) parseSet() Node {
	target := p.parseAssignTarget(true)
	if p.skipOp("=") {
		v := p.parseTuple(true)
		p.expectBlockEnd()
		return &Assign{Target: target, Value: v}
	}
	var fs []*Filter
	if p.isOp("|") {
		fs = p.parseFilterChain(nil)
	}
	p.expectBlockEnd()
	body, _ := p.parseBody("endset")
	p.expectBlockEnd()
	return &AssignBlock{Target: target, Filters: fs, Body: body}
}

// parseFilterChain parses "| f(args) | g" (the first "|" optional).
func (p *parser) parseFilterChain(arg Node) []*Filter {
	var fs []*Filter
	first := true
	for first || p.isOp("|") {
		if p.isOp("|") {
			p.next()
		}
		first = false
		f := &Filter{Arg: arg, Name: p.parseDottedName()}
		if p.isOp("(") {
			f.Args, f.Kwargs = p.parseCallArgs()
		}
		fs = append(fs, f)
	}
	return fs
}

func (p *parser) parseDottedName() string {
	name := p.expectName()
	for p.isOp(".") {
		p.next()
		name += "." + p.expectName()
	}
	return name
}

func (p *parser) parseAssignTarget(withNamespace bool) Node {
	var items []Node
	for {
		name := p.expectName()
		var t Node = &Name{Name: name}
		if withNamespace && p.isOp(".") {
			p.next()
			t = &Attr{X: t, Name: p.expectName()}
		}
		items = append(items, t)
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	if len(items) == 1 {
		return items[0]
	}
	return &Tuple{Items: items}
}

func (p *parser) parseParams() ([]string, []Node) {
	var names []string
	var defs []Node
	p.expectOp("(")
	for !p.isOp(")") {
		if len(names) > 0 {
			p.expectOp(",")
			if p.isOp(")") {
				break
			}
		}
		names = append(names, p.expectName())
		if p.skipOp("=") {
			defs = append(defs, p.parseExpr(true))
		} else if len(defs) > 0 {
			p.fail("non-default argument follows default argument")
		}
	}
	p.next()
	return names, defs
}

func (p *parser) parseMacro() Node {
	n := &Macro{Name: p.expectName()}
	n.Params, n.Defaults = p.parseParams()
	p.expectBlockEnd()
	n.Body, _ = p.parseBody("endmacro")
	p.expectBlockEnd()
	return n
}

func (p *parser) parseCallBlock() Node {
	n := &CallBlock{}
	if p.isOp("(") {
		n.Params, n.Defaults = p.parseParams()
	}
	c, ok := p.parseExpr(true).(*Call)
	if !ok {
		p.fail("expected call")
	}
	n.Call = c
	p.expectBlockEnd()
	n.Body, _ = p.parseBody("endcall")
	p.expectBlockEnd()
	return n
}

func (p *parser) parseWith() Node {
	n := &With{}
	for p.cur().kind != tkBlockEnd {
		if len(n.Targets) > 0 {
			p.expectOp(",")
		}
		n.Targets = append(n.Targets, p.parseAssignTarget(false))
		p.expectOp("=")
		n.Values = append(n.Values, p.parseExpr(true))
	}
	p.expectBlockEnd()
	n.Body, _ = p.parseBody("endwith")
	p.expectBlockEnd()
	return n
}

// parseTuple parses an expression, or a tuple when commas follow.
func (p *parser) parseTuple(withCond bool) Node {
	var items []Node
	comma := false
	for {
		if len(items) > 0 {
			if !p.isOp(",") {
				break
			}
			p.next()
			comma = true
		}
		if p.endOfTuple() {
			break
		}
		items = append(items, p.parseExpr(withCond))
	}
	if !comma {
		if len(items) == 0 {
			p.fail("expected an expression, got %s", p.cur())
		}
		return items[0]
	}
	return &Tuple{Items: items}
}

func (p *parser) parseTupleNoCond() Node { return p.parseTuple(false) }

func (p *parser) endOfTuple() bool {
	t := p.cur()
	switch t.kind {
	case tkBlockEnd, tkVarEnd, tkEOF:
		return true
	case tkOp:
		return t.val == ")" || t.val == "]" || t.val == "}"
	case tkName:
		return t.val == "in" || t.val == "recursive" || t.val == "if"
	}
	return false
}

func (p *parser) parseExpr(withCond bool) Node {
	p.enter()
	defer p.leave()
	if withCond {
		return p.parseCondExpr()
	}
	return p.parseOr()
}

func (p *parser) parseCondExpr() Node {
	x := p.parseOr()
	for p.isName("if") {
		p.next()
		c := p.parseOr()
		var e Node
		if p.isName("else") {
			p.next()
			e = p.parseCondExpr()
		}
		x = &Cond{Cond: c, Then: x, Else: e}
	}
	return x
}

func (p *parser) parseOr() Node {
	x := p.parseAnd()
	for p.isName("or") {
		p.next()
		x = &Binary{Op: "or", X: x, Y: p.parseAnd()}
	}
	return x
}

func (p *parser) parseAnd() Node {
	x := p.parseNot()
	for p.isName("and") {
		p.next()
		x = &Binary{Op: "and", X: x, Y: p.parseNot()}
	}
	return x
}

func (p *parser) parseNot() Node {
	p.enter()
	defer p.leave()
	if p.isName("not") {
		p.next()
		return &Unary{Op: "not", X: p.parseNot()}
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() Node {
	x := p.parseMath1()
	c := &Compare{X: x}
	for {
		t := p.cur()
		switch {
		case t.kind == tkOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == "<=" || t.val == ">" || t.val == ">="):
			p.next()
			c.Ops = append(c.Ops, t.val)
		case p.isName("in"):
			p.next()
			c.Ops = append(c.Ops, "in")
		case p.isName("not") && p.peek().kind == tkName && p.peek().val == "in":
			p.next()
			p.next()
			c.Ops = append(c.Ops, "not in")
		default:
			if len(c.Ops) == 0 {
				return x
			}
			return c
		}
		c.Ys = append(c.Ys, p.parseMath1())
	}
}

func (p *parser) parseMath1() Node {
	x := p.parseConcat()
	for p.isOp("+") || p.isOp("-") {
		op := p.next().val
		x = &Binary{Op: op, X: x, Y: p.parseConcat()}
	}
	return x
}

func (p *parser) parseConcat() Node {
	x := p.parseMath2()
	for p.isOp("~") {
		p.next()
		x = &Binary{Op: "~", X: x, Y: p.parseMath2()}
	}
	return x
}

func (p *parser) parseMath2() Node {
	x := p.parsePow()
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().val
		x = &Binary{Op: op, X: x, Y: p.parsePow()}
	}
	return x
}

func (p *parser) parsePow() Node {
	x := p.parseUnary(true)
	for p.isOp("**") {
		p.next()
		x = &Binary{Op: "**", X: x, Y: p.parseUnary(true)}
	}
	return x
}

func (p *parser) parseUnary(withFilter bool) Node {
	p.enter()
	defer p.leave()
	var x Node
	switch {
	case p.isOp("-"):
		p.next()
		x = &Unary{Op: "-", X: p.parseUnary(false)}
	case p.isOp("+"):
		p.next()
		x = &Unary{Op: "+", X: p.parseUnary(false)}
	default:
		x = p.parsePrimary()
	}
	x = p.parsePostfix(x)
	if withFilter {
		x = p.parseFilterExpr(x)
	}
	return x
}

func (p *parser) parsePrimary() Node {
	t := p.cur()
	switch t.kind {
	case tkName:
		p.next()
		switch t.val {
		case "true", "True":
			return &Const{Value: true}
		case "false", "False":
			return &Const{Value: false}
		case "none", "None":
			return &Const{Value: nil}
		}
		return &Name{Name: t.val}
	case tkString:
		s := ""
		for p.cur().kind == tkString {
			s += p.next().val
		}
		return &Const{Value: s}
	case tkInt:
		p.next()
		v, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			p.unsupported("integer literal out of the 64-bit range")
		}
		return &Const{Value: v}
	case tkFloat:
		p.next()
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			p.fail("bad float literal %q", t.val)
		}
		return &Const{Value: v}
	case tkOp:
		switch t.val {
		case "(":
			p.next()
			if p.isOp(")") {
				p.next()
				return &Tuple{}
			}
			x := p.parseTuple(true)
			p.expectOp(")")
			return x
		case "[":
			p.next()
			l := &List{}
			for !p.isOp("]") {
				if len(l.Items) > 0 {
					p.expectOp(",")
					if p.isOp("]") {
						break
					}
				}
				l.Items = append(l.Items, p.parseExpr(true))
			}
			p.next()
			return l
		case "{":
			p.next()
			d := &Dict{}
			for !p.isOp("}") {
				if len(d.Keys) > 0 {
					p.expectOp(",")
					if p.isOp("}") {
						break
					}
				}
				d.Keys = append(d.Keys, p.parseExpr(true))
				p.expectOp(":")
				d.Values = append(d.Values, p.parseExpr(true))
			}
			p.next()
			return d
		}
	}
	p.fail("unexpected %s", t)
	return nil
}

func (p *parser) parsePostfix(x Node) Node {
	for {
		switch {
		case p.isOp("."):
			p.next()
			t := p.next()
			switch t.kind {
			case tkName:
				x = &Attr{X: x, Name: t.val}
			case tkInt:
				v, _ := strconv.ParseInt(t.val, 10, 64)
				x = &Item{X: x, Index: &Const{Value: v}}
			default:
				p.pos--
				p.fail("expected name or number after '.'")
			}
		case p.isOp("["):
			p.next()
			x = &Item{X: x, Index: p.parseSubscript()}
		case p.isOp("("):
			args, kws := p.parseCallArgs()
			x = &Call{Func: x, Args: args, Kwargs: kws}
		default:
			return x
		}
	}
}

func (p *parser) parseSubscript() Node {
	var idx []Node
	for {
		idx = append(idx, p.parseSliceOrExpr())
		if !p.isOp(",") {
			break
		}
		p.next()
	}
	p.expectOp("]")
	if len(idx) == 1 {
		return idx[0]
	}
	return &Tuple{Items: idx}
}

func (p *parser) parseSliceOrExpr() Node {
	var start Node
	if !p.isOp(":") {
		start = p.parseExpr(true)
		if !p.isOp(":") {
			return start
		}
	}
	p.next()
	s := &Slice{Start: start}
	if !p.isOp("]") && !p.isOp(",") && !p.isOp(":") {
		s.Stop = p.parseExpr(true)
	}
	if p.skipOp(":") {
		if !p.isOp("]") && !p.isOp(",") {
			s.Step = p.parseExpr(true)
		}
	}
	return s
}

func (p *parser) parseCallArgs() ([]Node, []Kwarg) {
	p.expectOp("(")
	var args []Node
	var kws []Kwarg
	first := true
	for !p.isOp(")") {
		if !first {
			p.expectOp(",")
			if p.isOp(")") {
				break
			}
		}
		first = false
		if p.isOp("*") || p.isOp("**") {
			p.unsupported("*args / **kwargs in calls")
		}
		if p.cur().kind == tkName && p.peek().kind == tkOp && p.peek().val == "=" {
			name := p.next().val
			p.next()
			kws = append(kws, Kwarg{Name: name, Value: p.parseExpr(true)})
			continue
		}
		if len(kws) > 0 {
			p.fail("positional argument follows keyword argument")
		}
		args = append(args, p.parseExpr(true))
	}
	p.next()
	return args, kws
}

func (p *parser) parseFilterExpr(x Node) Node {
	for {
		switch {
		case p.isOp("|"):
			fs := p.parseFilterChainOnce(x)
			x = fs
		case p.isName("is"):
			x = p.parseTest(x)
		case p.isOp("("):
			args, kws := p.parseCallArgs()
			x = &Call{Func: x, Args: args, Kwargs: kws}
		default:
			return x
		}
	}
}

func (p *parser) parseFilterChainOnce(x Node) Node {
	p.next()
	f := &Filter{Arg: x, Name: p.parseDottedName()}
	if p.isOp("(") {
		f.Args, f.Kwargs = p.parseCallArgs()
	}
	return f
}

func (p *parser) parseTest(x Node) Node {
	p.next() // is
	neg := false
	if p.isName("not") {
		p.next()
		neg = true
	}
	t := &Test{Arg: x, Name: p.parseDottedName()}
	c := p.cur()
	switch {
	case p.isOp("("):
		t.Args, t.Kwargs = p.parseCallArgs()
	case (c.kind == tkName || c.kind == tkString || c.kind == tkInt || c.kind == tkFloat || p.isOp("[") || p.isOp("{")) &&
		!p.isName("else") && !p.isName("or") && !p.isName("and"):
		if p.isName("is") {
			p.fail("you cannot chain multiple tests with is")
		}
		t.Args = []Node{p.parsePostfix(p.parsePrimary())}
	}
	if neg {
		return &Unary{Op: "not", X: t}
	}
	return t
}
