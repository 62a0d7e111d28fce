package jinja

import (
	"fmt"
	"strings"
)

// scope is one level of variables (the render's, a loop body's, a macro
// call's); a lookup falls back to the enclosing levels.
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

// renderer is the state of one Render call.
type renderer struct {
	env     Env
	out     *strings.Builder
	globals map[string]any
	depth   int
	steps   int
}

// controlFlow is panicked by break and continue and recovered by the
// enclosing loop iteration (or by Render, outside any loop).
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
