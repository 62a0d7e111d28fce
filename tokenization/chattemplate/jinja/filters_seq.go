package jinja

import (
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// seqFilters are the filters on sequences and mappings.
var seqFilters = map[string]filterFn{
	"count":      filterLength,
	"length":     filterLength,
	"dictsort":   filterDictsort,
	"first":      filterFirst,
	"last":       filterLast,
	"items":      filterItems,
	"join":       filterJoin,
	"list":       filterList,
	"map":        filterMap,
	"max":        filterMax,
	"min":        filterMin,
	"reverse":    filterReverse,
	"select":     filterSelect,
	"reject":     filterReject,
	"selectattr": filterSelectattr,
	"rejectattr": filterRejectattr,
	"sort":       filterSort,
	"sum":        filterSum,
	"unique":     filterUnique,
}

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

func filterDictsort(r *renderer, v any, args []any, kws []kwval) any {
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
}

func filterFirst(r *renderer, v any, _ []any, _ []kwval) any {
	items := r.iterate(v)
	if len(items) == 0 {
		return Undefined{hint: "No first item, sequence was empty."}
	}
	return items[0]
}

func filterLast(r *renderer, v any, _ []any, _ []kwval) any {
	items := r.iterate(v)
	if len(items) == 0 {
		return Undefined{hint: "No last item, sequence was empty."}
	}
	return items[len(items)-1]
}

func filterItems(r *renderer, v any, _ []any, _ []kwval) any {
	switch d := v.(type) {
	case Undefined:
		return &ListVal{}
	case *DictVal:
		return dictItems(d)
	}
	throw("can only get item pairs from a mapping.")
	return nil
}

func filterJoin(r *renderer, v any, args []any, kws []kwval) any {
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
}

func filterList(r *renderer, v any, _ []any, _ []kwval) any {
	return &ListVal{Items: append([]any(nil), r.iterate(v)...)}
}

func filterMap(r *renderer, v any, args []any, kws []kwval) any {
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
}

func filterMax(r *renderer, v any, args []any, kws []kwval) any { return minMax(r, v, args, kws, 1) }

func filterMin(r *renderer, v any, args []any, kws []kwval) any { return minMax(r, v, args, kws, -1) }

func filterReverse(r *renderer, v any, _ []any, _ []kwval) any {
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
}

func filterSelect(r *renderer, v any, args []any, kws []kwval) any {
	return selectReject(r, v, args, kws, false, true)
}

func filterReject(r *renderer, v any, args []any, kws []kwval) any {
	return selectReject(r, v, args, kws, false, false)
}

func filterSelectattr(r *renderer, v any, args []any, kws []kwval) any {
	return selectReject(r, v, args, kws, true, true)
}

func filterRejectattr(r *renderer, v any, args []any, kws []kwval) any {
	return selectReject(r, v, args, kws, true, false)
}

func filterSort(r *renderer, v any, args []any, kws []kwval) any {
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
}

func filterSum(r *renderer, v any, args []any, kws []kwval) any {
	attr := argAt(args, kws, 0, "attribute", nil)
	var total any = argAt(args, kws, 1, "start", int64(0))
	for _, it := range r.iterate(v) {
		if attr != nil {
			it = r.getAttrPath(it, attr)
		}
		total = arith("+", total, it)
	}
	return total
}

func filterUnique(r *renderer, v any, args []any, kws []kwval) any {
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
