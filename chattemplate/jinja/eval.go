package jinja

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"
)

// SyntaxError is a template that does not parse.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("template syntax error, line %d: %s", e.Line, e.Msg)
}

// UnsupportedError is a template using a Jinja2 feature this engine does
// not implement; it is reported when the template is loaded, never as a
// silently different render.
type UnsupportedError struct {
	Line    int
	Feature string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("unsupported template feature, line %d: %s", e.Line, e.Feature)
}

// RenderError is a failure while rendering (an undefined value used, a
// type error, ...), as Jinja2 would raise.
type RenderError struct{ Msg string }

func (e *RenderError) Error() string { return "template render error: " + e.Msg }

// RaisedError is raise_exception(message) called by the template.
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return "template raised an exception: " + e.Message }

// renderPanic carries an error from deep inside evaluation to Render.
type renderPanic struct{ err error }

func throw(format string, args ...any) {
	panic(renderPanic{&RenderError{Msg: fmt.Sprintf(format, args...)}})
}

func throwErr(err error) { panic(renderPanic{err}) }

// Template is a parsed template. It is immutable and safe for concurrent
// Render calls.
type Template struct {
	body []Node
}

// Limits on work one render may do, so a hostile template or input fails
// with an error instead of exhausting the stack or memory.
const (
	maxCallDepth = 200      // nested macro calls
	maxOutput    = 64 << 20 // bytes of rendered text
	maxRangeLen  = 1 << 20  // items of one range()
	maxSteps     = 1 << 18  // loop iterations and macro calls
)

// checkLen fails a render that would build a string or list larger than
// the output cap.
func checkLen(n int) {
	if n > maxOutput {
		throw("value larger than %d bytes or items", maxOutput)
	}
}

func (r *renderer) step() {
	r.steps++
	if r.steps > maxSteps {
		throw("template did more than %d loop iterations and macro calls", maxSteps)
	}
}

// Parse parses a template with transformers' chat-template environment
// settings. Unknown filters and tests and unsupported tags are load-time
// errors (*UnsupportedError), as are syntax errors (*SyntaxError).
func Parse(src string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			if pe, ok := r.(parseError); ok {
				err = pe.err
				return
			}
			if re, ok := r.(runtime.Error); ok {
				err = fmt.Errorf("internal template parser error: %v", re)
				return
			}
			panic(r)
		}
	}()
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, _ := p.parseBody()
	t = &Template{body: body}
	if err := t.check(); err != nil {
		return nil, err
	}
	return t, nil
}

// check rejects at load time what Jinja2 rejects at compile time (unknown
// filters and tests) and the method calls this engine does not implement.
func (t *Template) check() error {
	var err error
	t.Walk(func(n Node) bool {
		if err != nil {
			return false
		}
		switch n := n.(type) {
		case *Filter:
			if _, ok := filters[n.Name]; !ok {
				err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", n.Name)}
			}
		case *Test:
			if _, ok := tests[n.Name]; !ok {
				err = &UnsupportedError{Feature: fmt.Sprintf("test %q", n.Name)}
			}
		case *FilterBlock:
			for _, f := range n.Filters {
				if _, ok := filters[f.Name]; !ok {
					err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", f.Name)}
				}
			}
		case *AssignBlock:
			for _, f := range n.Filters {
				if _, ok := filters[f.Name]; !ok {
					err = &UnsupportedError{Feature: fmt.Sprintf("filter %q", f.Name)}
				}
			}
		case *Call:
			if a, ok := n.Func.(*Attr); ok && unsupportedMethods[a.Name] {
				err = &UnsupportedError{Feature: fmt.Sprintf("method .%s()", a.Name)}
			}
		case *Name:
			if unsupportedGlobals[n.Name] {
				err = &UnsupportedError{Feature: fmt.Sprintf("global %s()", n.Name)}
			}
		}
		return true
	})
	return err
}

// Env holds what a render needs besides the variables.
type Env struct {
	// Now is strftime_now's clock; nil means time.Now.
	Now func() time.Time
}

// Render renders the template with vars: template values (see FromJSON)
// or plain Go nil, bools, numbers, strings, []any, []string and
// map[string]any. Errors are *RenderError, *RaisedError or, for a panic
// that escaped the engine's own checks, a plain error; Render never panics.
func (t *Template) Render(env Env, vars map[string]any) (out string, err error) {
	r := &renderer{env: env}
	defer func() {
		if rec := recover(); rec != nil {
			switch v := rec.(type) {
			case renderPanic:
				err = v.err
			case controlFlow:
				err = &RenderError{Msg: "break or continue outside a loop"}
			default:
				// Last resort: an engine bug must not take the daemon down.
				err = fmt.Errorf("internal template engine error: %v", rec)
			}
			out = ""
		}
	}()
	root := &scope{vars: map[string]any{}}
	for k, v := range vars {
		val, err := valueOf(v)
		if err != nil {
			return "", &RenderError{Msg: fmt.Sprintf("variable %s: %v", k, err)}
		}
		root.vars[k] = val
	}
	r.globals = r.makeGlobals()
	var b strings.Builder
	r.out = &b
	r.execList(t.body, root)
	return b.String(), nil
}

type scope struct {
	vars   map[string]any
	parent *scope
}

func (s *scope) lookup(name string) (any, bool) {
	for c := s; c != nil; c = c.parent {
		if v, ok := c.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

func (s *scope) child() *scope { return &scope{vars: map[string]any{}, parent: s} }

type renderer struct {
	env     Env
	out     *strings.Builder
	globals map[string]any
	depth   int
	steps   int
}

type controlFlow int

const (
	flowBreak controlFlow = iota + 1
	flowContinue
)

func (r *renderer) write(s string) {
	if r.out.Len()+len(s) > maxOutput {
		throw("rendered output exceeds %d bytes", maxOutput)
	}
	r.out.WriteString(s)
}

func (r *renderer) execList(ns []Node, sc *scope) {
	for _, n := range ns {
		r.exec(n, sc)
	}
}

func (r *renderer) exec(n Node, sc *scope) {
	switch n := n.(type) {
	case *Output:
		if n.Expr == nil {
			r.write(n.Text)
			return
		}
		r.write(toStr(r.eval(n.Expr, sc)))
	case *If:
		if Truthy(r.eval(n.Cond, sc)) {
			r.execList(n.Body, sc)
		} else {
			r.execList(n.Else, sc)
		}
	case *For:
		r.execFor(n, sc)
	case *Assign:
		r.assign(n.Target, r.eval(n.Value, sc), sc)
	case *AssignBlock:
		v := r.capture(n.Body, sc.child())
		var val any = v
		for _, f := range n.Filters {
			val = r.applyFilter(f, val, sc)
		}
		r.assign(n.Target, val, sc)
	case *Macro:
		sc.vars[n.Name] = r.makeMacro(n.Name, n.Params, n.Defaults, n.Body, sc)
	case *CallBlock:
		caller := r.makeMacro("caller", n.Params, n.Defaults, n.Body, sc)
		fn := r.eval(n.Call.Func, sc)
		m, ok := fn.(*callable)
		if !ok {
			throw("'%s' object is not callable", typeName(fn))
		}
		args, kws := r.evalArgs(n.Call.Args, n.Call.Kwargs, sc)
		kws = append(kws, kwval{"caller", caller})
		r.write(toStr(m.fn(args, kws)))
	case *FilterBlock:
		var val any = r.capture(n.Body, sc.child())
		for _, f := range n.Filters {
			val = r.applyFilter(f, val, sc)
		}
		r.write(toStr(val))
	case *With:
		inner := sc.child()
		vals := make([]any, len(n.Values))
		for i, v := range n.Values {
			vals[i] = r.eval(v, sc)
		}
		for i, t := range n.Targets {
			r.assign(t, vals[i], inner)
		}
		r.execList(n.Body, inner)
	case *Generation:
		r.execList(n.Body, sc)
	case *Break:
		panic(flowBreak)
	case *Continue:
		panic(flowContinue)
	default:
		throw("unexpected statement %T", n)
	}
}

// capture renders body into a string (block set, filter blocks, macros).
func (r *renderer) capture(body []Node, sc *scope) string {
	saved := r.out
	var b strings.Builder
	r.out = &b
	defer func() { r.out = saved }()
	r.execList(body, sc)
	if saved.Len()+b.Len() > maxOutput {
		throw("rendered output exceeds %d bytes", maxOutput)
	}
	return b.String()
}

func (r *renderer) assign(target Node, v any, sc *scope) {
	switch t := target.(type) {
	case *Name:
		sc.vars[t.Name] = v
	case *Attr:
		nsv, _ := sc.lookup(t.X.(*Name).Name)
		ns, ok := nsv.(*Namespace)
		if !ok {
			throw("cannot assign attribute on non-namespace object")
		}
		_ = ns.attrs.Set(t.Name, v)
	case *Tuple:
		items := r.iterate(v)
		if len(items) != len(t.Items) {
			throw("cannot unpack %d values into %d names", len(items), len(t.Items))
		}
		for i, it := range t.Items {
			r.assign(it, items[i], sc)
		}
	default:
		throw("cannot assign to %T", target)
	}
}

func (r *renderer) execFor(n *For, sc *scope) {
	seq := r.eval(n.Iter, sc)
	if _, ok := seq.(Undefined); !ok && seq == nil {
		throw("'NoneType' object is not iterable")
	}
	items := r.iterate(seq)
	if n.Filter != nil {
		var kept []any
		for _, it := range items {
			inner := sc.child()
			r.assign(n.Target, it, inner)
			if Truthy(r.eval(n.Filter, inner)) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		r.execList(n.Else, sc)
		return
	}
	loop := &loopObj{items: items}
	for i, it := range items {
		r.step()
		loop.index = i
		inner := sc.child()
		inner.vars["loop"] = loop
		r.assign(n.Target, it, inner)
		if r.runIteration(n.Body, inner) == flowBreak {
			break
		}
	}
}

func (r *renderer) runIteration(body []Node, sc *scope) (flow controlFlow) {
	defer func() {
		if rec := recover(); rec != nil {
			if f, ok := rec.(controlFlow); ok {
				flow = f
				return
			}
			panic(rec)
		}
	}()
	r.execList(body, sc)
	return 0
}

// loopObj is the "loop" variable of a for loop.
type loopObj struct {
	items []any
	index int
}

func (l *loopObj) attr(name string) any {
	n := len(l.items)
	switch name {
	case "index":
		return int64(l.index + 1)
	case "index0":
		return int64(l.index)
	case "revindex":
		return int64(n - l.index)
	case "revindex0":
		return int64(n - l.index - 1)
	case "first":
		return l.index == 0
	case "last":
		return l.index == n-1
	case "length":
		return int64(n)
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "previtem":
		if l.index == 0 {
			return Undefined{hint: "there is no previous item"}
		}
		return l.items[l.index-1]
	case "nextitem":
		if l.index == n-1 {
			return Undefined{hint: "there is no next item"}
		}
		return l.items[l.index+1]
	case "cycle":
		return &callable{name: "cycle", fn: func(args []any, _ []kwval) any {
			if len(args) == 0 {
				throw("no items for cycling given")
			}
			return args[l.index%len(args)]
		}}
	}
	return Undefined{hint: fmt.Sprintf("'LoopContext' object has no attribute '%s'", name)}
}

// iterate lists what a for loop over v visits.
func (r *renderer) iterate(v any) []any {
	switch v := v.(type) {
	case Undefined:
		return nil
	case *ListVal:
		return v.Items
	case *DictVal:
		return append([]any(nil), v.keys...)
	case string:
		out := make([]any, 0, len(v))
		for _, c := range v {
			out = append(out, string(c))
		}
		return out
	case *loopObj:
		return v.items
	}
	throw("'%s' object is not iterable", typeName(v))
	return nil
}

func (r *renderer) makeMacro(name string, params []string, defaults []Node, body []Node, def *scope) *callable {
	return &callable{name: name, fn: func(args []any, kws []kwval) any {
		r.step()
		if r.depth >= maxCallDepth {
			throw("maximum recursion depth exceeded")
		}
		r.depth++
		defer func() { r.depth-- }()
		sc := def.child()
		firstDefault := len(params) - len(defaults)
		var varargs []any
		for i, a := range args {
			if i < len(params) {
				sc.vars[params[i]] = a
			} else {
				varargs = append(varargs, a)
			}
		}
		extra := NewDict()
		for _, kw := range kws {
			found := false
			for _, p := range params {
				if p == kw.name {
					sc.vars[p] = kw.val
					found = true
				}
			}
			if !found {
				if kw.name == "caller" {
					sc.vars["caller"] = kw.val
					continue
				}
				_ = extra.Set(kw.name, kw.val)
			}
		}
		for i, p := range params {
			if _, ok := sc.vars[p]; ok {
				continue
			}
			if i >= firstDefault {
				sc.vars[p] = r.eval(defaults[i-firstDefault], sc)
			} else {
				sc.vars[p] = Undefined{hint: fmt.Sprintf("parameter '%s' was not provided", p)}
			}
		}
		if len(varargs) > 0 {
			sc.vars["varargs"] = &ListVal{Items: varargs, Tuple: true}
		} else {
			sc.vars["varargs"] = &ListVal{Tuple: true}
		}
		sc.vars["kwargs"] = extra
		return r.capture(body, sc)
	}}
}

func (r *renderer) evalArgs(args []Node, kws []Kwarg, sc *scope) ([]any, []kwval) {
	av := make([]any, len(args))
	for i, a := range args {
		av[i] = r.eval(a, sc)
	}
	var kv []kwval
	for _, k := range kws {
		kv = append(kv, kwval{k.Name, r.eval(k.Value, sc)})
	}
	return av, kv
}

func (r *renderer) eval(n Node, sc *scope) any {
	switch n := n.(type) {
	case *Const:
		return n.Value
	case *Name:
		if v, ok := sc.lookup(n.Name); ok {
			return v
		}
		if v, ok := r.globals[n.Name]; ok {
			return v
		}
		return Undefined{hint: fmt.Sprintf("'%s' is undefined", n.Name)}
	case *Attr:
		return r.getAttr(r.eval(n.X, sc), n.Name)
	case *Item:
		x := r.eval(n.X, sc)
		if s, ok := n.Index.(*Slice); ok {
			return r.slice(x, s, sc)
		}
		return r.getItem(x, r.eval(n.Index, sc))
	case *Call:
		fn := r.eval(n.Func, sc)
		args, kws := r.evalArgs(n.Args, n.Kwargs, sc)
		switch f := fn.(type) {
		case *callable:
			return f.fn(args, kws)
		case Undefined:
			throwErr(f.err())
		}
		throw("'%s' object is not callable", typeName(fn))
	case *Filter:
		return r.applyFilter(n, r.eval(n.Arg, sc), sc)
	case *Test:
		return r.applyTest(n, sc)
	case *Unary:
		x := r.eval(n.X, sc)
		switch n.Op {
		case "not":
			return !Truthy(x)
		case "-":
			switch v := x.(type) {
			case int64:
				return -v
			case float64:
				return -v
			case bool:
				if v {
					return int64(-1)
				}
				return int64(0)
			case Undefined:
				throwErr(v.err())
			}
			throw("bad operand type for unary -: '%s'", typeName(x))
		default:
			if _, ok := num(x); ok {
				return x
			}
			throw("bad operand type for unary +: '%s'", typeName(x))
		}
	case *Binary:
		switch n.Op {
		case "and":
			x := r.eval(n.X, sc)
			if !Truthy(x) {
				return x
			}
			return r.eval(n.Y, sc)
		case "or":
			x := r.eval(n.X, sc)
			if Truthy(x) {
				return x
			}
			return r.eval(n.Y, sc)
		case "~":
			x, y := toStr(r.eval(n.X, sc)), toStr(r.eval(n.Y, sc))
			checkLen(len(x) + len(y))
			return x + y
		}
		return arith(n.Op, r.eval(n.X, sc), r.eval(n.Y, sc))
	case *Compare:
		x := r.eval(n.X, sc)
		for i, op := range n.Ops {
			y := r.eval(n.Ys[i], sc)
			if !compareOp(op, x, y) {
				return false
			}
			x = y
		}
		return true
	case *Cond:
		if Truthy(r.eval(n.Cond, sc)) {
			return r.eval(n.Then, sc)
		}
		if n.Else == nil {
			return Undefined{hint: "the inline if-expression evaluated to false and no else section was defined"}
		}
		return r.eval(n.Else, sc)
	case *List:
		l := &ListVal{Items: make([]any, len(n.Items))}
		for i, it := range n.Items {
			l.Items[i] = r.eval(it, sc)
		}
		return l
	case *Tuple:
		l := &ListVal{Items: make([]any, len(n.Items)), Tuple: true}
		for i, it := range n.Items {
			l.Items[i] = r.eval(it, sc)
		}
		return l
	case *Dict:
		d := NewDict()
		for i, k := range n.Keys {
			if err := d.Set(r.eval(k, sc), r.eval(n.Values[i], sc)); err != nil {
				throwErr(&RenderError{Msg: err.Error()})
			}
		}
		return d
	}
	throw("cannot evaluate %T", n)
	return nil
}

func compareOp(op string, x, y any) bool {
	switch op {
	case "==":
		return equal(x, y)
	case "!=":
		return !equal(x, y)
	case "in":
		return contains(y, x)
	case "not in":
		return !contains(y, x)
	}
	for _, v := range []any{x, y} {
		if u, ok := v.(Undefined); ok {
			throwErr(u.err())
		}
	}
	c, err := compare(x, y)
	if err != nil {
		throwErr(err)
	}
	switch op {
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	default:
		return c >= 0
	}
}

// contains is Python's "x in container".
func contains(container, x any) bool {
	switch c := container.(type) {
	case string:
		s, ok := x.(string)
		if !ok {
			if u, isU := x.(Undefined); isU {
				throwErr(u.err())
			}
			throw("'in <string>' requires string as left operand, not %s", typeName(x))
		}
		return strings.Contains(c, s)
	case *ListVal:
		for _, it := range c.Items {
			if equal(it, x) {
				return true
			}
		}
		return false
	case *DictVal:
		_, ok := c.Get(x)
		return ok
	case Undefined:
		return false
	case *Namespace:
		_, ok := c.attrs.Get(x)
		return ok
	}
	throw("argument of type '%s' is not iterable", typeName(container))
	return false
}

func arith(op string, x, y any) any {
	if s, ok := x.(string); ok && op == "%" {
		if t, ok := y.(*ListVal); ok && t.Tuple {
			return pyPercent(s, t.Items)
		}
		return pyPercent(s, []any{y})
	}
	for _, v := range []any{x, y} {
		if u, ok := v.(Undefined); ok {
			throwErr(u.err())
		}
	}
	if op == "+" {
		switch a := x.(type) {
		case string:
			if b, ok := y.(string); ok {
				checkLen(len(a) + len(b))
				return a + b
			}
			throw("can only concatenate str (not \"%s\") to str", typeName(y))
		case *ListVal:
			if b, ok := y.(*ListVal); ok && b.Tuple == a.Tuple {
				checkLen(len(a.Items) + len(b.Items))
				items := make([]any, 0, len(a.Items)+len(b.Items))
				items = append(append(items, a.Items...), b.Items...)
				return &ListVal{Items: items, Tuple: a.Tuple}
			}
			throw("can only concatenate %s (not \"%s\") to %s", typeName(a), typeName(y), typeName(a))
		}
	}
	if op == "*" {
		if s, ok := x.(string); ok {
			if n, ok := y.(int64); ok {
				return repeatStr(s, n)
			}
		}
		if n, ok := x.(int64); ok {
			if s, ok := y.(string); ok {
				return repeatStr(s, n)
			}
		}
		if l, ok := x.(*ListVal); ok {
			if n, ok := y.(int64); ok && n*int64(len(l.Items)) <= maxRangeLen {
				out := &ListVal{Tuple: l.Tuple}
				for i := int64(0); i < n; i++ {
					out.Items = append(out.Items, l.Items...)
				}
				return out
			}
		}
	}
	a, ok1 := num(x)
	b, ok2 := num(y)
	if !ok1 || !ok2 {
		throw("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(x), typeName(y))
	}
	ai, aInt := intOf(x)
	bi, bInt := intOf(y)
	if aInt && bInt {
		switch op {
		case "+":
			return ai + bi
		case "-":
			return ai - bi
		case "*":
			return ai * bi
		case "//":
			if bi == 0 {
				throw("integer division or modulo by zero")
			}
			q := ai / bi
			if (ai%bi != 0) && ((ai < 0) != (bi < 0)) {
				q--
			}
			return q
		case "%":
			if bi == 0 {
				throw("integer division or modulo by zero")
			}
			m := ai % bi
			if m != 0 && ((m < 0) != (bi < 0)) {
				m += bi
			}
			return m
		case "**":
			if bi >= 0 {
				res := int64(1)
				for i := int64(0); i < bi; i++ {
					res *= ai
				}
				return res
			}
		}
	}
	switch op {
	case "+":
		return a + b
	case "-":
		return a - b
	case "*":
		return a * b
	case "/":
		if b == 0 {
			throw("division by zero")
		}
		return a / b
	case "//":
		if b == 0 {
			throw("float floor division by zero")
		}
		return math.Floor(a / b)
	case "%":
		if b == 0 {
			throw("float modulo")
		}
		m := math.Mod(a, b)
		if m != 0 && ((m < 0) != (b < 0)) {
			m += b
		}
		return m
	case "**":
		return math.Pow(a, b)
	}
	throw("unknown operator %s", op)
	return nil
}

func repeatStr(s string, n int64) string {
	if n <= 0 || s == "" {
		return ""
	}
	if n > maxOutput || int64(len(s))*n > maxOutput {
		throw("value larger than %d bytes", maxOutput)
	}
	return strings.Repeat(s, int(n))
}

func intOf(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// getAttr is jinja2's environment.getattr: a Python attribute (a method)
// first, then the item of that name, else undefined.
func (r *renderer) getAttr(x any, name string) any {
	switch v := x.(type) {
	case Undefined:
		throwErr(v.err())
	case *DictVal:
		if m := dictMethod(v, name); m != nil {
			return m
		}
		if it, ok := v.Get(name); ok {
			return it
		}
		return Undefined{hint: fmt.Sprintf("'dict object' has no attribute '%s'", name)}
	case *Namespace:
		if it, ok := v.attrs.Get(name); ok {
			return it
		}
		return Undefined{hint: fmt.Sprintf("'Namespace' object has no attribute '%s'", name)}
	case string:
		if m := strMethod(v, name); m != nil {
			return m
		}
	case *ListVal:
		if m := listMethod(v, name); m != nil {
			return m
		}
	case *loopObj:
		return v.attr(name)
	}
	return Undefined{hint: fmt.Sprintf("'%s object' has no attribute '%s'", typeName(x), name)}
}

// getItem is jinja2's environment.getitem: the item first, then for a
// string key the attribute of that name, else undefined.
func (r *renderer) getItem(x, key any) any {
	switch v := x.(type) {
	case Undefined:
		throwErr(v.err())
	case *DictVal:
		if it, ok := v.Get(key); ok {
			return it
		}
	case *ListVal:
		if i, ok := intOf(key); ok {
			n := int64(len(v.Items))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return v.Items[i]
			}
			return Undefined{hint: fmt.Sprintf("%s object has no element %d", typeName(v), i)}
		}
	case string:
		if i, ok := intOf(key); ok {
			rs := []rune(v)
			n := int64(len(rs))
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return string(rs[i])
			}
			return Undefined{hint: fmt.Sprintf("str object has no element %d", i)}
		}
	case *loopObj:
		if s, ok := key.(string); ok {
			return v.attr(s)
		}
	}
	if s, ok := key.(string); ok {
		return r.getAttr(x, s)
	}
	return Undefined{hint: fmt.Sprintf("'%s object' has no element %s", typeName(x), reprString(key))}
}

func (r *renderer) slice(x any, s *Slice, sc *scope) any {
	if u, ok := x.(Undefined); ok {
		throwErr(u.err())
	}
	bound := func(n Node) (int64, bool) {
		if n == nil {
			return 0, false
		}
		v := r.eval(n, sc)
		if v == nil {
			return 0, false
		}
		i, ok := intOf(v)
		if !ok {
			throw("slice indices must be integers or None")
		}
		return i, true
	}
	start, hasStart := bound(s.Start)
	stop, hasStop := bound(s.Stop)
	step, hasStep := bound(s.Step)
	if !hasStep {
		step = 1
	}
	if step == 0 {
		throw("slice step cannot be zero")
	}
	var items []any
	var runes []rune
	_, isStr := x.(string)
	switch v := x.(type) {
	case *ListVal:
		items = v.Items
	case string:
		runes = []rune(v)
	default:
		throw("'%s' object is not subscriptable", typeName(x))
	}
	n := int64(len(items))
	if isStr {
		n = int64(len(runes))
	}
	norm := func(i int64, has bool, def int64) int64 {
		if !has {
			return def
		}
		if i < 0 {
			i += n
			if i < 0 {
				if step < 0 {
					return -1
				}
				return 0
			}
		}
		if i >= n {
			if step < 0 {
				return n - 1
			}
			return n
		}
		return i
	}
	var lo, hi int64
	if step > 0 {
		lo, hi = norm(start, hasStart, 0), norm(stop, hasStop, n)
	} else {
		lo, hi = norm(start, hasStart, n-1), norm(stop, hasStop, -1)
	}
	var idx []int64
	if step > 0 {
		for i := lo; i < hi; i += step {
			idx = append(idx, i)
		}
	} else {
		for i := lo; i > hi; i += step {
			idx = append(idx, i)
		}
	}
	if isStr {
		var b strings.Builder
		for _, i := range idx {
			b.WriteRune(runes[i])
		}
		return b.String()
	}
	out := &ListVal{Items: make([]any, 0, len(idx)), Tuple: x.(*ListVal).Tuple}
	for _, i := range idx {
		out.Items = append(out.Items, items[i])
	}
	return out
}
