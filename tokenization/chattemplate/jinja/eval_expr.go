package jinja

import (
	"fmt"
	"strings"
)

// evalArgs evaluates a call's positional and keyword arguments.
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

// eval evaluates an expression.
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
