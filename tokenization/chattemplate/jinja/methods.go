package jinja

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

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
