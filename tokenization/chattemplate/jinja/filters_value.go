package jinja

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// valueFilters convert, default or serialise any value.
var valueFilters = map[string]filterFn{
	"abs":     filterAbs,
	"attr":    filterAttr,
	"default": filterDefault,
	"d":       filterDefault,
	"float":   filterFloat,
	"int":     filterInt,
	"round":   filterRound,
	"tojson":  filterTojson,
}

func filterAbs(r *renderer, v any, _ []any, _ []kwval) any {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return -x
		}
		return x
	case float64:
		return math.Abs(x)
	case bool:
		return arith("+", int64(0), x)
	}
	throw("bad operand type for abs(): '%s'", typeName(v))
	return nil
}

func filterAttr(r *renderer, v any, args []any, kws []kwval) any {
	// Python attributes only: unlike ".name", no item fallback.
	name := strArg(argAt(args, kws, 0, "name", nil), "attribute name")
	if d, ok := v.(*DictVal); ok && dictMethod(d, name) == nil {
		return Undefined{hint: fmt.Sprintf("'dict object' has no attribute '%s'", name)}
	}
	return r.getAttr(v, name)
}

func filterDefault(r *renderer, v any, args []any, kws []kwval) any {
	def := argAt(args, kws, 0, "default_value", "")
	boolean := Truthy(argAt(args, kws, 1, "boolean", false))
	if _, ok := v.(Undefined); ok || (boolean && !Truthy(v)) {
		return def
	}
	return v
}

func filterFloat(r *renderer, v any, args []any, kws []kwval) any {
	def := argAt(args, kws, 0, "default", 0.0)
	switch x := v.(type) {
	case float64:
		return x
	case int64:
		return float64(x)
	case bool:
		f, _ := num(x)
		return f
	case string:
		if f, err := strconv.ParseFloat(strings.TrimFunc(x, IsPySpace), 64); err == nil {
			return f
		}
	}
	return def
}

func filterInt(r *renderer, v any, args []any, kws []kwval) any {
	def := argAt(args, kws, 0, "default", int64(0))
	switch x := v.(type) {
	case int64:
		return x
	case bool:
		i, _ := intOf(x)
		return i
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return def
		}
		return int64(x)
	case string:
		s := strings.TrimFunc(x, IsPySpace)
		if i, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return int64(f)
		}
	}
	return def
}

func filterRound(r *renderer, v any, args []any, kws []kwval) any {
	prec, _ := intOf(argAt(args, kws, 0, "precision", int64(0)))
	method := argAt(args, kws, 1, "method", "common")
	f, ok := num(v)
	if !ok {
		throw("round expects a number")
	}
	p := math.Pow(10, float64(prec))
	switch method {
	case "common":
		return math.RoundToEven(f*p) / p
	case "ceil":
		return math.Ceil(f*p) / p
	case "floor":
		return math.Floor(f*p) / p
	}
	throw("method must be common, ceil or floor")
	return nil
}

func filterTojson(r *renderer, v any, args []any, kws []kwval) any {
	if len(args) > 1 {
		throw("tojson: too many positional arguments")
	}
	indent := -1
	ind := ""
	if iv := argAt(args, kws, 0, "indent", nil); iv != nil {
		switch x := iv.(type) {
		case int64:
			indent = int(max(0, min(x, 1<<10)))
			ind = strings.Repeat(" ", indent)
		case string:
			indent, ind = 0, x
		default:
			throw("tojson indent must be an int or a string")
		}
	}
	for _, k := range kws {
		switch k.name {
		case "indent", "sort_keys":
		case "ensure_ascii", "separators":
			if k.val != nil && k.val != false {
				throw("tojson: %s is not supported", k.name)
			}
		default:
			throw("tojson() got an unexpected keyword argument '%s'", k.name)
		}
	}
	s, err := toJSON(v, indent, ind, Truthy(argAt(nil, kws, 0, "sort_keys", false)))
	if err != nil {
		throwErr(err)
	}
	return s
}
