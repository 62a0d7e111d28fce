package jinja

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// stringFilters are the filters on text.
var stringFilters = map[string]filterFn{
	"capitalize": filterCapitalize,
	"escape":     filterEscape,
	"e":          filterEscape,
	"format":     filterFormat,
	"indent":     filterIndent,
	"lower":      filterLower,
	"replace":    filterReplace,
	"safe":       filterString, // no autoescape: safe is str()
	"string":     filterString,
	"title":      filterTitle,
	"trim":       filterTrim,
	"upper":      filterUpper,
	"wordcount":  filterWordcount,
}

func filterCapitalize(r *renderer, v any, _ []any, _ []kwval) any { return pyCapitalize(toStr(v)) }

func filterEscape(r *renderer, v any, _ []any, _ []kwval) any {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toStr(v))
}

func filterFormat(r *renderer, v any, args []any, _ []kwval) any {
	return pyPercent(strArg(v, "format string"), args)
}

func filterIndent(r *renderer, v any, args []any, kws []kwval) any {
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
}

func filterLower(r *renderer, v any, _ []any, _ []kwval) any { return pyLower(toStr(v)) }

func filterReplace(r *renderer, v any, args []any, kws []kwval) any {
	s := toStr(v)
	old := toStr(argAt(args, kws, 0, "old", ""))
	repl := toStr(argAt(args, kws, 1, "new", ""))
	n := -1
	if c := argAt(args, kws, 2, "count", nil); c != nil {
		ci, _ := intOf(c)
		n = int(ci)
	}
	return pyReplace(s, old, repl, n)
}

func filterString(r *renderer, v any, _ []any, _ []kwval) any { return toStr(v) }

func filterTitle(r *renderer, v any, _ []any, _ []kwval) any {
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
}

func filterTrim(r *renderer, v any, args []any, kws []kwval) any {
	s := toStr(v)
	if c := argAt(args, kws, 0, "chars", nil); c != nil {
		return pyStrip(s, strArg(c, "chars"), true, true)
	}
	return strings.TrimFunc(s, IsPySpace)
}

func filterUpper(r *renderer, v any, _ []any, _ []kwval) any { return pyUpper(toStr(v)) }

func filterWordcount(r *renderer, v any, _ []any, _ []kwval) any {
	return int64(len(wordRe.FindAllString(toStr(v), -1)))
}

var (
	// Python's \s and \w are Unicode-aware; RE2's are ASCII-only.
	titleSplit = regexp.MustCompile(`[-\s\x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}({\[<]+`)
	wordRe     = regexp.MustCompile(`[\p{L}\p{N}\p{Mn}\p{Mc}\p{Pc}]+`)
)
