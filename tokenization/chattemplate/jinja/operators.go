package jinja

import (
	"math"
	"strings"
)

// compareOp applies a comparison or membership operator.
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

// arith applies an arithmetic operator with Python's rules (str % args
// formats).
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
