package jinja

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Values are Python's, as a template sees them:
//
//	nil        None
//	bool       bool
//	int64      int
//	float64    float
//	string     str
//	*ListVal   list or tuple
//	*DictVal   dict (insertion-ordered)
//	Undefined  jinja2's default Undefined
//
// plus namespaces, callables and loop objects made while rendering.

// ListVal is a Python list, or a tuple when Tuple is set.
type ListVal struct {
	Items []any
	Tuple bool
}

// DictVal is an insertion-ordered Python dict.
type DictVal struct {
	keys  []any
	vals  []any
	index map[any]int
}

// NewDict returns an empty dict.
func NewDict() *DictVal { return &DictVal{index: map[any]int{}} }

// hashKey makes equal Python keys (1, 1.0, True) equal Go map keys.
func hashKey(k any) (any, bool) {
	switch k := k.(type) {
	case nil, string, int64:
		return k, true
	case bool:
		if k {
			return int64(1), true
		}
		return int64(0), true
	case float64:
		if k == math.Trunc(k) && math.Abs(k) < 1<<62 {
			return int64(k), true
		}
		return k, true
	case *ListVal:
		if !k.Tuple {
			return nil, false
		}
		var b strings.Builder
		b.WriteString("\x00tuple")
		for _, it := range k.Items {
			if _, ok := hashKey(it); !ok {
				return nil, false
			}
			b.WriteString(reprString(it))
			b.WriteByte(0)
		}
		return b.String(), true
	}
	return nil, false
}

// Set sets d[k] = v, keeping the key's first position.
func (d *DictVal) Set(k, v any) error {
	hk, ok := hashKey(k)
	if !ok {
		return fmt.Errorf("unhashable type: '%s'", typeName(k))
	}
	if i, ok := d.index[hk]; ok {
		d.vals[i] = v
		return nil
	}
	d.index[hk] = len(d.keys)
	d.keys = append(d.keys, k)
	d.vals = append(d.vals, v)
	return nil
}

// Get returns d[k].
func (d *DictVal) Get(k any) (any, bool) {
	hk, ok := hashKey(k)
	if !ok {
		return nil, false
	}
	i, ok := d.index[hk]
	if !ok {
		return nil, false
	}
	return d.vals[i], true
}

// Len is the number of keys.
func (d *DictVal) Len() int { return len(d.keys) }

// Keys returns the keys in insertion order (the slice is shared).
func (d *DictVal) Keys() []any { return d.keys }

func (d *DictVal) copyDict() *DictVal {
	c := &DictVal{keys: append([]any(nil), d.keys...), vals: append([]any(nil), d.vals...), index: make(map[any]int, len(d.index))}
	for k, v := range d.index {
		c.index[k] = v
	}
	return c
}

// Undefined is a missing variable, attribute or item. Like jinja2's
// default Undefined it prints as "", iterates as empty and is false, and
// fails when used in arithmetic, called or looked into.
type Undefined struct{ hint string }

func (u Undefined) err() error {
	if u.hint == "" {
		return &RenderError{Msg: "value is undefined"}
	}
	return &RenderError{Msg: u.hint}
}

// Namespace is what namespace() returns: a mutable attribute bag.
type Namespace struct{ attrs *DictVal }

// callable is a builtin function, bound method or macro.
type callable struct {
	name string
	fn   func(args []any, kwargs []kwval) any
}

type kwval struct {
	name string
	val  any
}

// valueOf converts plain Go data (maps, whose keys it sorts, slices,
// numbers, strings) into template values; template values pass through.
func valueOf(v any) (any, error) {
	switch v := v.(type) {
	case nil, bool, int64, float64, string, *ListVal, *DictVal, Undefined, *Namespace:
		return v, nil
	case int:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case float32:
		return float64(v), nil
	case []string:
		l := &ListVal{Items: make([]any, len(v))}
		for i, s := range v {
			l.Items[i] = s
		}
		return l, nil
	case []any:
		l := &ListVal{Items: make([]any, len(v))}
		for i, s := range v {
			c, err := valueOf(s)
			if err != nil {
				return nil, err
			}
			l.Items[i] = c
		}
		return l, nil
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := NewDict()
		for _, k := range keys {
			c, err := valueOf(v[k])
			if err != nil {
				return nil, err
			}
			_ = d.Set(k, c)
		}
		return d, nil
	}
	return nil, fmt.Errorf("unsupported Go value of type %T", v)
}

func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case *ListVal:
		if v.Tuple {
			return "tuple"
		}
		return "list"
	case *DictVal:
		return "dict"
	case Undefined:
		return "Undefined"
	case *Namespace:
		return "Namespace"
	case *callable:
		return "function"
	case *loopObj:
		return "LoopContext"
	}
	return fmt.Sprintf("%T", v)
}

// Truthy is Python's bool() of a template value: false for None,
// undefined, False, zero, "" and empty lists and dicts.
func Truthy(v any) bool {
	switch v := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case *ListVal:
		return len(v.Items) > 0
	case *DictVal:
		return v.Len() > 0
	}
	return true
}

// toStr is Python's str().
func toStr(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case Undefined:
		return ""
	}
	return reprString(v)
}

func reprString(v any) string {
	var b strings.Builder
	writeRepr(&b, v, 0)
	return b.String()
}

const maxReprDepth = 200

func writeRepr(b *strings.Builder, v any, depth int) {
	if depth > maxReprDepth {
		panic(renderPanic{&RenderError{Msg: "maximum recursion depth exceeded while getting the repr of an object"}})
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if v {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case float64:
		b.WriteString(pyFloat(v))
	case string:
		pyQuote(b, v)
	case Undefined:
		b.WriteString("")
	case *ListVal:
		open, close := "[", "]"
		if v.Tuple {
			open, close = "(", ")"
		}
		b.WriteString(open)
		for i, it := range v.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it, depth+1)
		}
		if v.Tuple && len(v.Items) == 1 {
			b.WriteString(",")
		}
		b.WriteString(close)
	case *DictVal:
		b.WriteString("{")
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, k, depth+1)
			b.WriteString(": ")
			writeRepr(b, v.vals[i], depth+1)
		}
		b.WriteString("}")
	case *Namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, v.attrs, depth+1)
		b.WriteString(">")
	case *callable:
		fmt.Fprintf(b, "<function %s>", v.name)
	case *loopObj:
		fmt.Fprintf(b, "<LoopContext %d/%d>", v.index+1, len(v.items))
	default:
		fmt.Fprintf(b, "%v", v)
	}
}

// pyFloat is Python's repr(float): the shortest round-trip digits, in
// positional notation for exponents -4..15 and scientific otherwise.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	mant, expS, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expS)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	if exp < -4 || exp >= 16 {
		out = digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign = "-"
			exp = -exp
		}
		out += fmt.Sprintf("e%s%02d", sign, exp)
	} else if exp < 0 {
		out = "0." + strings.Repeat("0", -exp-1) + digits
	} else if len(digits) <= exp+1 {
		out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	} else {
		out = digits[:exp+1] + "." + digits[exp+1:]
	}
	if neg {
		return "-" + out
	}
	return out
}

// pyQuote writes Python's repr of a str.
func pyQuote(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError:
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
}

// toJSON is json.dumps(v, ensure_ascii=False, indent=indent,
// sort_keys=sortKeys), transformers' tojson filter. indent < 0 means None.
func toJSON(v any, indent int, indentStr string, sortKeys bool) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, indent >= 0 || indentStr != "", indentStr, 0, sortKeys); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v any, pretty bool, ind string, level int, sortKeys bool) error {
	if level > maxReprDepth {
		return &RenderError{Msg: "maximum recursion depth exceeded while encoding a JSON object"}
	}
	nl := func(l int) {
		b.WriteByte('\n')
		for i := 0; i < l; i++ {
			b.WriteString(ind)
		}
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case float64:
		switch {
		case math.IsInf(v, 1):
			b.WriteString("Infinity")
		case math.IsInf(v, -1):
			b.WriteString("-Infinity")
		case math.IsNaN(v):
			b.WriteString("NaN")
		default:
			b.WriteString(pyFloat(v))
		}
	case string:
		jsonQuote(b, v)
	case *ListVal:
		if len(v.Items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range v.Items {
			if i > 0 {
				if pretty {
					b.WriteByte(',')
				} else {
					b.WriteString(", ")
				}
			}
			if pretty {
				nl(level + 1)
			}
			if err := writeJSON(b, it, pretty, ind, level+1, sortKeys); err != nil {
				return err
			}
		}
		if pretty {
			nl(level)
		}
		b.WriteByte(']')
	case *DictVal:
		if v.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		order := make([]int, v.Len())
		for i := range order {
			order[i] = i
		}
		if sortKeys {
			var err error
			sort.SliceStable(order, func(i, j int) bool {
				c, e := compare(v.keys[order[i]], v.keys[order[j]])
				if e != nil {
					err = e
				}
				return c < 0
			})
			if err != nil {
				return err
			}
		}
		b.WriteByte('{')
		for n, i := range order {
			if n > 0 {
				if pretty {
					b.WriteByte(',')
				} else {
					b.WriteString(", ")
				}
			}
			if pretty {
				nl(level + 1)
			}
			switch k := v.keys[i].(type) {
			case string:
				jsonQuote(b, k)
			case nil:
				b.WriteString(`"null"`)
			case bool, int64, float64:
				var kb strings.Builder
				_ = writeJSON(&kb, k, false, "", 0, false)
				jsonQuote(b, kb.String())
			default:
				return &RenderError{Msg: fmt.Sprintf("keys must be str, int, float, bool or None, not %s", typeName(k))}
			}
			b.WriteString(": ")
			if err := writeJSON(b, v.vals[i], pretty, ind, level+1, sortKeys); err != nil {
				return err
			}
		}
		if pretty {
			nl(level)
		}
		b.WriteByte('}')
	case *Namespace, *callable, *loopObj, Undefined:
		return &RenderError{Msg: fmt.Sprintf("Object of type %s is not JSON serializable", typeName(v))}
	default:
		return &RenderError{Msg: fmt.Sprintf("Object of type %T is not JSON serializable", v)}
	}
	return nil
}

// jsonQuote writes a JSON string as Python's json module does with
// ensure_ascii=False: only '"', '\\' and control characters are escaped.
func jsonQuote(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				fmt.Fprintf(b, `\u%04x`, c)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// equal is Python's ==.
func equal(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		_, ok := b.(Undefined)
		return ok
	case string:
		s, ok := b.(string)
		return ok && a == s
	case bool, int64, float64:
		x, ok1 := num(a)
		y, ok2 := num(b)
		return ok1 && ok2 && x == y
	case *ListVal:
		l, ok := b.(*ListVal)
		if !ok || l.Tuple != a.Tuple || len(l.Items) != len(a.Items) {
			return false
		}
		for i := range a.Items {
			if !equal(a.Items[i], l.Items[i]) {
				return false
			}
		}
		return true
	case *DictVal:
		d, ok := b.(*DictVal)
		if !ok || d.Len() != a.Len() {
			return false
		}
		for i, k := range a.keys {
			v, ok := d.Get(k)
			if !ok || !equal(a.vals[i], v) {
				return false
			}
		}
		return true
	}
	return a == b
}

// num converts bool, int and float to float64 for comparisons.
func num(v any) (float64, bool) {
	switch v := v.(type) {
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// compare orders two values as Python's < does; mixed types are an error.
func compare(a, b any) (int, error) {
	if x, ok := num(a); ok {
		if y, ok := num(b); ok {
			ai, aInt := a.(int64)
			bi, bInt := b.(int64)
			if aInt && bInt {
				return cmpOrdered(ai, bi), nil
			}
			return cmpOrdered(x, y), nil
		}
	}
	switch a := a.(type) {
	case string:
		if s, ok := b.(string); ok {
			return strings.Compare(a, s), nil
		}
	case *ListVal:
		if l, ok := b.(*ListVal); ok && l.Tuple == a.Tuple {
			for i := 0; i < len(a.Items) && i < len(l.Items); i++ {
				if equal(a.Items[i], l.Items[i]) {
					continue
				}
				return compare(a.Items[i], l.Items[i])
			}
			return cmpOrdered(len(a.Items), len(l.Items)), nil
		}
	}
	return 0, &RenderError{Msg: fmt.Sprintf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))}
}

func cmpOrdered[T int | int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
