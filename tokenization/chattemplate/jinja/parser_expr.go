package jinja

import "strconv"

// Expressions follow Jinja2's precedence, loosest first: conditional
// expression, or, and, not, comparisons and in, + and -, ~, * / // and %,
// **, unary - and +, then a primary with its postfixes (attributes, items,
// calls), filters and "is" tests.

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
