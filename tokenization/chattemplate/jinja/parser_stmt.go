package jinja

// parseStatement parses the tag after "{%" that starts a statement.
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
