package jinja

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

type filterFn func(r *renderer, v any, args []any, kws []kwval) any

// argAt returns the i-th argument given positionally or by name, or def.
func argAt(args []any, kws []kwval, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	for _, k := range kws {
		if k.name == name {
			return k.val
		}
	}
	return def
}

func strArg(v any, what string) string {
	s, ok := v.(string)
	if !ok {
		if u, isU := v.(Undefined); isU {
			throwErr(u.err())
		}
		throw("%s must be a string, not %s", what, typeName(v))
	}
	return s
}

var filters map[string]filterFn

func init() {
	filters = map[string]filterFn{
		"abs": func(r *renderer, v any, _ []any, _ []kwval) any {
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
		},
		"attr": func(r *renderer, v any, args []any, kws []kwval) any {
			// Python attributes only: unlike ".name", no item fallback.
			name := strArg(argAt(args, kws, 0, "name", nil), "attribute name")
			if d, ok := v.(*DictVal); ok && dictMethod(d, name) == nil {
				return Undefined{hint: fmt.Sprintf("'dict object' has no attribute '%s'", name)}
			}
			return r.getAttr(v, name)
		},
		"capitalize": func(r *renderer, v any, _ []any, _ []kwval) any { return pyCapitalize(toStr(v)) },
		"count":      filterLength,
		"length":     filterLength,
		"default":    filterDefault,
		"d":          filterDefault,
		"dictsort": func(r *renderer, v any, args []any, kws []kwval) any {
			d, ok := v.(*DictVal)
			if !ok {
				throw("dictsort expects a dict")
			}
			byValue := argAt(args, kws, 1, "by", "key") == "value"
			reverse := Truthy(argAt(args, kws, 2, "reverse", false))
			caseSens := Truthy(argAt(args, kws, 0, "case_sensitive", false))
			pairs := make([]any, d.Len())
			for i, k := range d.keys {
				pairs[i] = &ListVal{Items: []any{k, d.vals[i]}, Tuple: true}
			}
			sortValues(pairs, func(p any) any {
				x := p.(*ListVal).Items[0]
				if byValue {
					x = p.(*ListVal).Items[1]
				}
				if s, ok := x.(string); ok && !caseSens {
					return pyLower(s)
				}
				return x
			}, reverse)
			return &ListVal{Items: pairs}
		},
		"escape": filterEscape,
		"e":      filterEscape,
		"first": func(r *renderer, v any, _ []any, _ []kwval) any {
			items := r.iterate(v)
			if len(items) == 0 {
				return Undefined{hint: "No first item, sequence was empty."}
			}
			return items[0]
		},
		"last": func(r *renderer, v any, _ []any, _ []kwval) any {
			items := r.iterate(v)
			if len(items) == 0 {
				return Undefined{hint: "No last item, sequence was empty."}
			}
			return items[len(items)-1]
		},
		"float": func(r *renderer, v any, args []any, kws []kwval) any {
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
		},
		"int": func(r *renderer, v any, args []any, kws []kwval) any {
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
		},
		"items": func(r *renderer, v any, _ []any, _ []kwval) any {
			switch d := v.(type) {
			case Undefined:
				return &ListVal{}
			case *DictVal:
				return dictItems(d)
			}
			throw("can only get item pairs from a mapping.")
			return nil
		},
		"indent": func(r *renderer, v any, args []any, kws []kwval) any {
			s := toStr(v)
			w := argAt(args, kws, 0, "width", int64(4))
			ind := ""
			switch x := w.(type) {
			case string:
				ind = x
			case int64:
				ind = strings.Repeat(" ", int(max(0, min(x, 1<<16))))
			default:
				throw("indent width must be an int or a string")
			}
			first := Truthy(argAt(args, kws, 1, "first", false))
			blank := Truthy(argAt(args, kws, 2, "blank", false))
			s += "\n"
			lines := pySplitLines(s)
			checkLen(len(s) + len(lines)*len(ind))
			var out string
			if blank {
				out = strings.Join(lines, "\n"+ind)
			} else {
				out = lines[0]
				if len(lines) > 1 {
					rest := make([]string, len(lines)-1)
					for i, l := range lines[1:] {
						if l != "" {
							l = ind + l
						}
						rest[i] = l
					}
					out += "\n" + strings.Join(rest, "\n")
				}
			}
			if first {
				out = ind + out
			}
			return out
		},
		"join": func(r *renderer, v any, args []any, kws []kwval) any {
			sep := toStr(argAt(args, kws, 0, "d", ""))
			attr := argAt(args, kws, 1, "attribute", nil)
			items := r.iterate(v)
			parts := make([]string, len(items))
			for i, it := range items {
				if attr != nil {
					it = r.getAttrPath(it, attr)
				}
				parts[i] = toStr(it)
			}
			total := len(sep) * len(parts)
			for _, p := range parts {
				total += len(p)
			}
			checkLen(total)
			return strings.Join(parts, sep)
		},
		"list": func(r *renderer, v any, _ []any, _ []kwval) any {
			return &ListVal{Items: append([]any(nil), r.iterate(v)...)}
		},
		"lower": func(r *renderer, v any, _ []any, _ []kwval) any { return pyLower(toStr(v)) },
		"upper": func(r *renderer, v any, _ []any, _ []kwval) any { return pyUpper(toStr(v)) },
		"map": func(r *renderer, v any, args []any, kws []kwval) any {
			items := r.iterate(v)
			out := &ListVal{Items: make([]any, 0, len(items))}
			if attr := argAt(nil, kws, 0, "attribute", nil); attr != nil {
				def := argAt(nil, kws, 0, "default", nil)
				for _, it := range items {
					x := r.getAttrPath(it, attr)
					if _, ok := x.(Undefined); ok && def != nil {
						x = def
					}
					out.Items = append(out.Items, x)
				}
				return out
			}
			if len(args) == 0 {
				throw("map requires a filter name or attribute=")
			}
			name := strArg(args[0], "filter name")
			f, ok := filters[name]
			if !ok {
				throw("no filter named '%s'", name)
			}
			for _, it := range items {
				out.Items = append(out.Items, f(r, it, args[1:], kws))
			}
			return out
		},
		"max": func(r *renderer, v any, args []any, kws []kwval) any { return minMax(r, v, args, kws, 1) },
		"min": func(r *renderer, v any, args []any, kws []kwval) any { return minMax(r, v, args, kws, -1) },
		"replace": func(r *renderer, v any, args []any, kws []kwval) any {
			s := toStr(v)
			old := toStr(argAt(args, kws, 0, "old", ""))
			repl := toStr(argAt(args, kws, 1, "new", ""))
			n := -1
			if c := argAt(args, kws, 2, "count", nil); c != nil {
				ci, _ := intOf(c)
				n = int(ci)
			}
			return pyReplace(s, old, repl, n)
		},
		"reverse": func(r *renderer, v any, _ []any, _ []kwval) any {
			if s, ok := v.(string); ok {
				rs := []rune(s)
				for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
					rs[i], rs[j] = rs[j], rs[i]
				}
				return string(rs)
			}
			items := r.iterate(v)
			out := make([]any, len(items))
			for i, it := range items {
				out[len(items)-1-i] = it
			}
			return &ListVal{Items: out}
		},
		"round": func(r *renderer, v any, args []any, kws []kwval) any {
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
		},
		"safe":   func(r *renderer, v any, _ []any, _ []kwval) any { return toStr(v) },
		"string": func(r *renderer, v any, _ []any, _ []kwval) any { return toStr(v) },
		"select": func(r *renderer, v any, args []any, kws []kwval) any {
			return selectReject(r, v, args, kws, false, true)
		},
		"reject": func(r *renderer, v any, args []any, kws []kwval) any {
			return selectReject(r, v, args, kws, false, false)
		},
		"selectattr": func(r *renderer, v any, args []any, kws []kwval) any {
			return selectReject(r, v, args, kws, true, true)
		},
		"rejectattr": func(r *renderer, v any, args []any, kws []kwval) any {
			return selectReject(r, v, args, kws, true, false)
		},
		"sort": func(r *renderer, v any, args []any, kws []kwval) any {
			reverse := Truthy(argAt(args, kws, 0, "reverse", false))
			caseSens := Truthy(argAt(args, kws, 1, "case_sensitive", false))
			attr := argAt(args, kws, 2, "attribute", nil)
			items := append([]any(nil), r.iterate(v)...)
			sortValues(items, func(x any) any {
				if attr != nil {
					x = r.getAttrPath(x, attr)
				}
				if s, ok := x.(string); ok && !caseSens {
					return pyLower(s)
				}
				return x
			}, reverse)
			return &ListVal{Items: items}
		},
		"sum": func(r *renderer, v any, args []any, kws []kwval) any {
			attr := argAt(args, kws, 0, "attribute", nil)
			var total any = argAt(args, kws, 1, "start", int64(0))
			for _, it := range r.iterate(v) {
				if attr != nil {
					it = r.getAttrPath(it, attr)
				}
				total = arith("+", total, it)
			}
			return total
		},
		"title": func(r *renderer, v any, _ []any, _ []kwval) any {
			parts := titleSplit.Split(toStr(v), -1)
			seps := titleSplit.FindAllString(toStr(v), -1)
			var b strings.Builder
			for i, p := range parts {
				if p != "" {
					first, n := utf8.DecodeRuneInString(p)
					b.WriteString(pyUpper(string(first)) + pyLower(p[n:]))
				}
				if i < len(seps) {
					b.WriteString(seps[i])
				}
			}
			return b.String()
		},
		"tojson": func(r *renderer, v any, args []any, kws []kwval) any {
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
		},
		"trim": func(r *renderer, v any, args []any, kws []kwval) any {
			s := toStr(v)
			if c := argAt(args, kws, 0, "chars", nil); c != nil {
				return pyStrip(s, strArg(c, "chars"), true, true)
			}
			return strings.TrimFunc(s, IsPySpace)
		},
		"unique": func(r *renderer, v any, args []any, kws []kwval) any {
			caseSens := Truthy(argAt(args, kws, 0, "case_sensitive", false))
			attr := argAt(args, kws, 1, "attribute", nil)
			out := &ListVal{}
			var seen []any
			for _, it := range r.iterate(v) {
				key := it
				if attr != nil {
					key = r.getAttrPath(it, attr)
				}
				if s, ok := key.(string); ok && !caseSens {
					key = pyLower(s)
				}
				dup := false
				for _, s := range seen {
					if equal(s, key) {
						dup = true
						break
					}
				}
				if !dup {
					seen = append(seen, key)
					out.Items = append(out.Items, it)
				}
			}
			return out
		},
		"wordcount": func(r *renderer, v any, _ []any, _ []kwval) any {
			return int64(len(wordRe.FindAllString(toStr(v), -1)))
		},
		"format": func(r *renderer, v any, args []any, _ []kwval) any {
			return pyPercent(strArg(v, "format string"), args)
		},
	}
}

var (
	// Python's \s and \w are Unicode-aware; RE2's are ASCII-only.
	titleSplit = regexp.MustCompile(`[-\s\x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}({\[<]+`)
	wordRe     = regexp.MustCompile(`[\p{L}\p{N}\p{Mn}\p{Mc}\p{Pc}]+`)
)

func filterLength(r *renderer, v any, _ []any, _ []kwval) any {
	switch x := v.(type) {
	case string:
		return int64(utf8.RuneCountInString(x))
	case *ListVal:
		return int64(len(x.Items))
	case *DictVal:
		return int64(x.Len())
	case Undefined:
		return int64(0)
	case *Namespace:
		throw("object of type 'Namespace' has no len()")
	}
	throw("object of type '%s' has no len()", typeName(v))
	return nil
}

func filterDefault(r *renderer, v any, args []any, kws []kwval) any {
	def := argAt(args, kws, 0, "default_value", "")
	boolean := Truthy(argAt(args, kws, 1, "boolean", false))
	if _, ok := v.(Undefined); ok || (boolean && !Truthy(v)) {
		return def
	}
	return v
}

func filterEscape(r *renderer, v any, _ []any, _ []kwval) any {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toStr(v))
}

func minMax(r *renderer, v any, args []any, kws []kwval, sign int) any {
	caseSens := Truthy(argAt(args, kws, 0, "case_sensitive", false))
	attr := argAt(args, kws, 1, "attribute", nil)
	items := r.iterate(v)
	if len(items) == 0 {
		return Undefined{hint: "no items in the sequence"}
	}
	key := func(x any) any {
		if attr != nil {
			x = r.getAttrPath(x, attr)
		}
		if s, ok := x.(string); ok && !caseSens {
			return pyLower(s)
		}
		return x
	}
	best := items[0]
	for _, it := range items[1:] {
		c, err := compare(key(it), key(best))
		if err != nil {
			throwErr(err)
		}
		if c*sign > 0 {
			best = it
		}
	}
	return best
}

func sortValues(items []any, key func(any) any, reverse bool) {
	var err error
	sort.SliceStable(items, func(i, j int) bool {
		a, b := key(items[i]), key(items[j])
		if reverse {
			a, b = b, a
		}
		c, e := compare(a, b)
		if e != nil {
			err = e
		}
		return c < 0
	})
	if err != nil {
		throwErr(err)
	}
}

// getAttrPath resolves jinja2's attribute= argument ("a.b", or an int).
func (r *renderer) getAttrPath(x, attr any) any {
	if i, ok := attr.(int64); ok {
		return r.getItem(x, i)
	}
	for _, part := range strings.Split(toStr(attr), ".") {
		if i, err := strconv.ParseInt(part, 10, 64); err == nil {
			x = r.getItem(x, i)
		} else {
			x = r.getItem(x, part)
		}
	}
	return x
}

func selectReject(r *renderer, v any, args []any, kws []kwval, byAttr, want bool) any {
	items := r.iterate(v)
	var attr any
	if byAttr {
		if len(args) == 0 {
			throw("missing attribute name")
		}
		attr, args = args[0], args[1:]
	}
	test := func(x any) bool { return Truthy(x) }
	if len(args) > 0 {
		name := strArg(args[0], "test name")
		t, ok := tests[name]
		if !ok {
			throw("no test named '%s'", name)
		}
		targs := args[1:]
		test = func(x any) bool { return t(r, x, targs) }
	}
	out := &ListVal{}
	for _, it := range items {
		x := it
		if byAttr {
			x = r.getAttrPath(it, attr)
		}
		if test(x) == want {
			out.Items = append(out.Items, it)
		}
	}
	return out
}

func dictItems(d *DictVal) *ListVal {
	out := &ListVal{Items: make([]any, d.Len())}
	for i, k := range d.keys {
		out.Items[i] = &ListVal{Items: []any{k, d.vals[i]}, Tuple: true}
	}
	return out
}

func (r *renderer) applyFilter(f *Filter, v any, sc *scope) any {
	fn, ok := filters[f.Name]
	if !ok {
		throw("no filter named '%s'", f.Name)
	}
	args, kws := r.evalArgs(f.Args, f.Kwargs, sc)
	return fn(r, v, args, kws)
}

var tests map[string]func(r *renderer, v any, args []any) bool

func init() {
	cmp := func(op string) func(r *renderer, v any, args []any) bool {
		return func(r *renderer, v any, args []any) bool {
			if len(args) != 1 {
				throw("test needs one argument")
			}
			return compareOp(op, v, args[0])
		}
	}
	isNum := func(v any) bool {
		switch v.(type) {
		case int64, float64, bool:
			return true
		}
		return false
	}
	tests = map[string]func(r *renderer, v any, args []any) bool{
		"defined":   func(r *renderer, v any, _ []any) bool { _, u := v.(Undefined); return !u },
		"undefined": func(r *renderer, v any, _ []any) bool { _, u := v.(Undefined); return u },
		"none":      func(r *renderer, v any, _ []any) bool { return v == nil },
		"boolean":   func(r *renderer, v any, _ []any) bool { _, ok := v.(bool); return ok },
		"true":      func(r *renderer, v any, _ []any) bool { return v == true },
		"false":     func(r *renderer, v any, _ []any) bool { return v == false },
		"integer":   func(r *renderer, v any, _ []any) bool { _, ok := v.(int64); return ok },
		"float":     func(r *renderer, v any, _ []any) bool { _, ok := v.(float64); return ok },
		"number":    func(r *renderer, v any, _ []any) bool { return isNum(v) },
		"string":    func(r *renderer, v any, _ []any) bool { _, ok := v.(string); return ok },
		"mapping":   func(r *renderer, v any, _ []any) bool { _, ok := v.(*DictVal); return ok },
		"iterable": func(r *renderer, v any, _ []any) bool {
			switch v.(type) {
			case string, *ListVal, *DictVal, Undefined:
				return true
			}
			return false
		},
		"sequence": func(r *renderer, v any, _ []any) bool {
			switch v.(type) {
			case string, *ListVal, *DictVal, Undefined:
				return true
			}
			return false
		},
		"callable": func(r *renderer, v any, _ []any) bool { _, ok := v.(*callable); return ok },
		"sameas": func(r *renderer, v any, args []any) bool {
			if len(args) != 1 {
				throw("sameas needs one argument")
			}
			switch v.(type) {
			case nil, bool, *ListVal, *DictVal, *Namespace:
				return v == args[0] // identity
			}
			return equal(v, args[0]) && typeName(v) == typeName(args[0])
		},
		"escaped": func(r *renderer, v any, _ []any) bool { return false },
		"odd": func(r *renderer, v any, _ []any) bool {
			i, ok := intOf(v)
			if !ok {
				throw("odd expects an integer")
			}
			return i%2 != 0
		},
		"even": func(r *renderer, v any, _ []any) bool {
			i, ok := intOf(v)
			if !ok {
				throw("even expects an integer")
			}
			return i%2 == 0
		},
		"divisibleby": func(r *renderer, v any, args []any) bool {
			if len(args) != 1 {
				throw("divisibleby needs one argument")
			}
			m := arith("%", v, args[0])
			return !Truthy(m)
		},
		"lower": func(r *renderer, v any, _ []any) bool { s, ok := v.(string); return ok && s == pyLower(s) },
		"upper": func(r *renderer, v any, _ []any) bool { s, ok := v.(string); return ok && s == pyUpper(s) },
		"in": func(r *renderer, v any, args []any) bool {
			if len(args) != 1 {
				throw("in needs one argument")
			}
			return contains(args[0], v)
		},
		"eq": cmp("=="), "equalto": cmp("=="), "==": cmp("=="),
		"ne": cmp("!="), "!=": cmp("!="),
		"lt": cmp("<"), "lessthan": cmp("<"), "<": cmp("<"),
		"le": cmp("<="), "<=": cmp("<="),
		"gt": cmp(">"), "greaterthan": cmp(">"), ">": cmp(">"),
		"ge": cmp(">="), ">=": cmp(">="),
	}
}

func (r *renderer) applyTest(t *Test, sc *scope) any {
	fn, ok := tests[t.Name]
	if !ok {
		throw("no test named '%s'", t.Name)
	}
	if len(t.Kwargs) > 0 {
		throw("keyword arguments to tests are not supported")
	}
	v := r.eval(t.Arg, sc)
	args, _ := r.evalArgs(t.Args, nil, sc)
	return fn(r, v, args)
}

// Methods on values, as the sandbox allows them.

func method(name string, fn func(args []any, kws []kwval) any) *callable {
	return &callable{name: name, fn: fn}
}

// unsupportedMethods are Python methods this engine does not implement;
// calling one is a load-time error rather than a wrong render.
var unsupportedMethods = map[string]bool{
	"format": true, "format_map": true, "center": true, "ljust": true, "rjust": true, "zfill": true,
	"expandtabs": true, "partition": true, "rpartition": true, "swapcase": true, "casefold": true,
	"translate": true, "maketrans": true, "encode": true, "splitlines": true, "istitle": true,
	"isidentifier": true, "isprintable": true, "isdecimal": true, "isnumeric": true,
	"fromkeys": true,
}

// unsupportedGlobals are Jinja2 globals this engine does not provide.
var unsupportedGlobals = map[string]bool{"lipsum": true, "cycler": true, "joiner": true}

func strMethod(s, name string) *callable {
	switch name {
	case "startswith", "endswith":
		return method(name, func(args []any, kws []kwval) any {
			if len(args) == 0 {
				throw("%s() takes at least 1 argument", name)
			}
			var cands []string
			switch p := args[0].(type) {
			case string:
				cands = []string{p}
			case *ListVal:
				for _, it := range p.Items {
					cands = append(cands, strArg(it, name+" argument"))
				}
			default:
				throw("%s first arg must be str or a tuple of str, not %s", name, typeName(args[0]))
			}
			for _, c := range cands {
				if name == "startswith" && strings.HasPrefix(s, c) || name == "endswith" && strings.HasSuffix(s, c) {
					return true
				}
			}
			return false
		})
	case "strip", "lstrip", "rstrip":
		return method(name, func(args []any, kws []kwval) any {
			c := argAt(args, kws, 0, "chars", nil)
			left, right := name != "rstrip", name != "lstrip"
			if c == nil {
				if left {
					s = strings.TrimLeftFunc(s, IsPySpace)
				}
				if right {
					s = strings.TrimRightFunc(s, IsPySpace)
				}
				return s
			}
			return pyStrip(s, strArg(c, "chars"), left, right)
		})
	case "split", "rsplit":
		return method(name, func(args []any, kws []kwval) any {
			sep := argAt(args, kws, 0, "sep", nil)
			n := int64(-1)
			if m := argAt(args, kws, 1, "maxsplit", nil); m != nil {
				n, _ = intOf(m)
			}
			var parts []string
			if sep == nil {
				parts = splitWhitespace(s, int(n), name == "rsplit")
			} else {
				sp := strArg(sep, "separator")
				if sp == "" {
					throw("empty separator")
				}
				if n < 0 {
					parts = strings.Split(s, sp)
				} else if name == "split" {
					parts = strings.SplitN(s, sp, int(n)+1)
				} else {
					parts = rsplitN(s, sp, int(n))
				}
			}
			out := &ListVal{Items: make([]any, len(parts))}
			for i, p := range parts {
				out.Items[i] = p
			}
			return out
		})
	case "replace":
		return method(name, func(args []any, kws []kwval) any {
			if len(args) < 2 {
				throw("replace() takes at least 2 arguments")
			}
			n := int64(-1)
			if len(args) > 2 {
				n, _ = intOf(args[2])
			}
			return pyReplace(s, strArg(args[0], "old"), strArg(args[1], "new"), int(n))
		})
	case "removeprefix", "removesuffix":
		return method(name, func(args []any, _ []kwval) any {
			if len(args) != 1 {
				throw("%s() takes exactly one argument", name)
			}
			a := strArg(args[0], name+" argument")
			if name == "removeprefix" {
				return strings.TrimPrefix(s, a)
			}
			return strings.TrimSuffix(s, a)
		})
	case "isascii":
		return method(name, func([]any, []kwval) any {
			for i := 0; i < len(s); i++ {
				if s[i] >= 0x80 {
					return false
				}
			}
			return true
		})
	case "upper":
		return method(name, func([]any, []kwval) any { return pyUpper(s) })
	case "lower":
		return method(name, func([]any, []kwval) any { return pyLower(s) })
	case "title":
		return method(name, func([]any, []kwval) any { return pyTitle(s) })
	case "capitalize":
		return method(name, func([]any, []kwval) any { return pyCapitalize(s) })
	case "find", "rfind", "index", "rindex", "count":
		return method(name, func(args []any, kws []kwval) any {
			if len(args) == 0 {
				throw("%s() takes at least 1 argument", name)
			}
			sub := strArg(args[0], "substring")
			var i int
			switch name {
			case "count":
				if sub == "" {
					return int64(utf8.RuneCountInString(s) + 1)
				}
				return int64(strings.Count(s, sub))
			case "find", "index":
				i = strings.Index(s, sub)
			default:
				i = strings.LastIndex(s, sub)
			}
			if i < 0 {
				if name == "index" || name == "rindex" {
					throw("substring not found")
				}
				return int64(-1)
			}
			return int64(utf8.RuneCountInString(s[:i]))
		})
	case "join":
		return method(name, func(args []any, kws []kwval) any {
			if len(args) != 1 {
				throw("join() takes exactly one argument")
			}
			var parts []string
			switch l := args[0].(type) {
			case *ListVal:
				for _, it := range l.Items {
					parts = append(parts, strArg(it, "sequence item"))
				}
			case string:
				for _, c := range l {
					parts = append(parts, string(c))
				}
			default:
				throw("can only join an iterable")
			}
			return strings.Join(parts, s)
		})
	case "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper":
		return method(name, func([]any, []kwval) any {
			if s == "" {
				return false
			}
			switch name {
			case "islower":
				return s == pyLower(s) && s != pyUpper(s)
			case "isupper":
				return s == pyUpper(s) && s != pyLower(s)
			}
			for _, c := range s {
				var ok bool
				switch name {
				case "isdigit":
					ok = unicode.IsDigit(c)
				case "isalpha":
					ok = unicode.IsLetter(c)
				case "isalnum":
					ok = unicode.IsLetter(c) || unicode.IsNumber(c)
				case "isspace":
					ok = IsPySpace(c)
				}
				if !ok {
					return false
				}
			}
			return true
		})
	}
	return nil
}

func dictMethod(d *DictVal, name string) *callable {
	switch name {
	case "items":
		return method(name, func([]any, []kwval) any { return dictItems(d) })
	case "keys":
		return method(name, func([]any, []kwval) any { return &ListVal{Items: append([]any(nil), d.keys...)} })
	case "values":
		return method(name, func([]any, []kwval) any { return &ListVal{Items: append([]any(nil), d.vals...)} })
	case "get":
		return method(name, func(args []any, _ []kwval) any {
			if len(args) == 0 {
				throw("get expected at least 1 argument")
			}
			if v, ok := d.Get(args[0]); ok {
				return v
			}
			if len(args) > 1 {
				return args[1]
			}
			return nil
		})
	case "copy":
		return method(name, func([]any, []kwval) any { return d.copyDict() })
	case "pop", "popitem", "update", "clear", "setdefault":
		return method(name, func([]any, []kwval) any {
			throw("access to attribute '%s' of 'dict' object is unsafe", name)
			return nil
		})
	}
	return nil
}

func listMethod(l *ListVal, name string) *callable {
	switch name {
	case "index":
		return method(name, func(args []any, _ []kwval) any {
			if len(args) == 0 {
				throw("index expected 1 argument")
			}
			for i, it := range l.Items {
				if equal(it, args[0]) {
					return int64(i)
				}
			}
			throw("%s is not in list", reprString(args[0]))
			return nil
		})
	case "count":
		return method(name, func(args []any, _ []kwval) any {
			if len(args) == 0 {
				throw("count expected 1 argument")
			}
			n := int64(0)
			for _, it := range l.Items {
				if equal(it, args[0]) {
					n++
				}
			}
			return n
		})
	case "copy":
		return method(name, func([]any, []kwval) any { return &ListVal{Items: append([]any(nil), l.Items...), Tuple: l.Tuple} })
	case "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse":
		return method(name, func([]any, []kwval) any {
			throw("access to attribute '%s' of '%s' object is unsafe", name, typeName(l))
			return nil
		})
	}
	return nil
}

func (r *renderer) makeGlobals() map[string]any {
	now := r.env.Now
	if now == nil {
		now = time.Now
	}
	return map[string]any{
		"raise_exception": method("raise_exception", func(args []any, _ []kwval) any {
			msg := ""
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			throwErr(&RaisedError{Message: msg})
			return nil
		}),
		"strftime_now": method("strftime_now", func(args []any, _ []kwval) any {
			if len(args) != 1 {
				throw("strftime_now takes one argument")
			}
			return strftime(now(), strArg(args[0], "format"))
		}),
		"namespace": method("namespace", func(args []any, kws []kwval) any {
			ns := &Namespace{attrs: NewDict()}
			for _, a := range args {
				d, ok := a.(*DictVal)
				if !ok {
					throw("namespace() positional argument must be a dict")
				}
				for i, k := range d.keys {
					_ = ns.attrs.Set(k, d.vals[i])
				}
			}
			for _, k := range kws {
				_ = ns.attrs.Set(k.name, k.val)
			}
			return ns
		}),
		"range": method("range", func(args []any, _ []kwval) any {
			var start, stop, step int64 = 0, 0, 1
			ints := make([]int64, len(args))
			for i, a := range args {
				v, ok := intOf(a)
				if !ok {
					throw("range() arguments must be integers")
				}
				ints[i] = v
			}
			switch len(ints) {
			case 1:
				stop = ints[0]
			case 2:
				start, stop = ints[0], ints[1]
			case 3:
				start, stop, step = ints[0], ints[1], ints[2]
			default:
				throw("range expected 1 to 3 arguments")
			}
			if step == 0 {
				throw("range() arg 3 must not be zero")
			}
			out := &ListVal{}
			for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
				if len(out.Items) >= maxRangeLen {
					throw("range too big, more than %d items", maxRangeLen)
				}
				out.Items = append(out.Items, i)
			}
			return out
		}),
		"dict": method("dict", func(args []any, kws []kwval) any {
			d := NewDict()
			for _, a := range args {
				src, ok := a.(*DictVal)
				if !ok {
					throw("dict() positional argument must be a dict")
				}
				for i, k := range src.keys {
					_ = d.Set(k, src.vals[i])
				}
			}
			for _, k := range kws {
				_ = d.Set(k.name, k.val)
			}
			return d
		}),
	}
}

// Python string helpers.

// pyLower and pyUpper use Unicode's full case mappings, as Python's
// str.lower and str.upper do ("ß" upper-cases to "SS").
func pyLower(s string) string { return cases.Lower(language.Und).String(s) }
func pyUpper(s string) string { return cases.Upper(language.Und).String(s) }

// pyTitleRune is Python's title-casing of one character ("ﬁ" becomes "Fi").
func pyTitleRune(r rune) string { return cases.Title(language.Und).String(string(r)) }

func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }

// pyCapitalize is str.capitalize: the first character title-cased, the
// rest lower-cased.
func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	first, n := utf8.DecodeRuneInString(s)
	return pyTitleRune(first) + pyLower(s[n:])
}

// pyTitle is str.title(): a cased character after an uncased one is
// title-cased, other cased characters lower-cased.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, c := range s {
		switch {
		case !isCased(c):
			b.WriteRune(c)
			prevCased = false
			continue
		case prevCased:
			b.WriteString(pyLower(string(c)))
		default:
			b.WriteString(pyTitleRune(c))
		}
		prevCased = true
	}
	return b.String()
}

func pyStrip(s, chars string, left, right bool) string {
	in := func(r rune) bool { return strings.ContainsRune(chars, r) }
	if left {
		s = strings.TrimLeftFunc(s, in)
	}
	if right {
		s = strings.TrimRightFunc(s, in)
	}
	return s
}

func pyReplace(s, old, repl string, n int) string {
	if len(repl) > len(old) {
		c := strings.Count(s, old)
		if old == "" {
			c = utf8.RuneCountInString(s) + 1
		}
		checkLen(len(s) + c*(len(repl)-len(old)))
	}
	if old == "" {
		// Python inserts repl between every character (and at both ends).
		rs := []rune(s)
		var b strings.Builder
		count := 0
		for i := 0; i <= len(rs); i++ {
			if n < 0 || count < n {
				b.WriteString(repl)
				count++
			}
			if i < len(rs) {
				b.WriteRune(rs[i])
			}
		}
		return b.String()
	}
	return strings.Replace(s, old, repl, n)
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for n != 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append(out, s[i+len(sep):])
		s = s[:i]
		n--
	}
	out = append(out, s)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func splitWhitespace(s string, n int, fromRight bool) []string {
	if n < 0 {
		f := strings.FieldsFunc(s, IsPySpace)
		if f == nil {
			f = []string{}
		}
		return f
	}
	if fromRight {
		var out []string
		s = strings.TrimRightFunc(s, IsPySpace)
		for n > 0 && s != "" {
			i := strings.LastIndexFunc(s, IsPySpace)
			if i < 0 {
				break
			}
			_, w := utf8.DecodeRuneInString(s[i:])
			out = append(out, s[i+w:])
			s = strings.TrimRightFunc(s[:i], IsPySpace)
			n--
		}
		if s != "" {
			out = append(out, s)
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	out := []string{}
	s = strings.TrimLeftFunc(s, IsPySpace)
	for n > 0 && s != "" {
		i := strings.IndexFunc(s, IsPySpace)
		if i < 0 {
			break
		}
		out = append(out, s[:i])
		s = strings.TrimLeftFunc(s[i:], IsPySpace)
		n--
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// pySplitLines is str.splitlines() for the line breaks Python knows.
func pySplitLines(s string) []string {
	var out []string
	start := 0
	rs := []rune(s)
	b := 0
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		w := utf8.RuneLen(c)
		switch c {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029, '\r':
			out = append(out, s[start:b])
			if c == '\r' && i+1 < len(rs) && rs[i+1] == '\n' {
				i++
				b++
			}
			b += w
			start = b
			continue
		}
		b += w
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// pyPercent is the "%s" / "%d" subset of Python's % formatting (jinja's
// format filter).
func pyPercent(f string, args []any) string {
	var b strings.Builder
	ai := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case '%':
			b.WriteByte('%')
		case 's', 'd', 'r':
			if ai >= len(args) {
				throw("not enough arguments for format string")
			}
			a := args[ai]
			ai++
			switch f[i] {
			case 's':
				b.WriteString(toStr(a))
			case 'r':
				b.WriteString(reprString(a))
			default:
				n, ok := num(a)
				if !ok {
					throw("%%d format: a real number is required, not %s", typeName(a))
				}
				b.WriteString(strconv.FormatInt(int64(n), 10))
			}
		default:
			throw("unsupported format character '%c'", f[i])
		}
	}
	if ai < len(args) {
		throw("not all arguments converted during string formatting")
	}
	return b.String()
}

// strftime implements the C-locale directives chat templates use.
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case '-':
			if i+1 < len(f) {
				i++
				switch f[i] {
				case 'd':
					fmt.Fprintf(&b, "%d", t.Day())
				case 'm':
					fmt.Fprintf(&b, "%d", int(t.Month()))
				case 'H':
					fmt.Fprintf(&b, "%d", t.Hour())
				default:
					throwErr(&RenderError{Msg: fmt.Sprintf("unsupported strftime directive %%-%c", f[i])})
				}
			}
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			throwErr(&RenderError{Msg: fmt.Sprintf("unsupported strftime directive %%%c", f[i])})
		}
	}
	return b.String()
}
