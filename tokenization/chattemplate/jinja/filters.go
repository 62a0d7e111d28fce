package jinja

// filterFn is a filter: v is the value filtered, args and kws the call's
// positional and keyword arguments.
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

// strArg returns v if it is a string and fails the render otherwise.
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

// filters maps a filter name to its implementation, gathered from the
// per-subject tables. It is filled by init, not by its initializer,
// because the map filter looks filters up by name: a table referring to
// filters while filters is built from the tables would be an
// initialization cycle.
var filters = map[string]filterFn{}

func init() {
	for _, table := range []map[string]filterFn{stringFilters, seqFilters, valueFilters} {
		for name, fn := range table {
			if _, dup := filters[name]; dup {
				panic("jinja: filter " + name + " registered twice")
			}
			filters[name] = fn
		}
	}
}

func (r *renderer) applyFilter(f *Filter, v any, sc *scope) any {
	fn, ok := filters[f.Name]
	if !ok {
		throw("no filter named '%s'", f.Name)
	}
	args, kws := r.evalArgs(f.Args, f.Kwargs, sc)
	return fn(r, v, args, kws)
}
