package jinja

type testFn func(r *renderer, v any, args []any) bool

// tests maps a test name ("x is name") to its implementation.
var tests = map[string]testFn{
	"defined":     func(r *renderer, v any, _ []any) bool { _, u := v.(Undefined); return !u },
	"undefined":   func(r *renderer, v any, _ []any) bool { _, u := v.(Undefined); return u },
	"none":        func(r *renderer, v any, _ []any) bool { return v == nil },
	"boolean":     func(r *renderer, v any, _ []any) bool { _, ok := v.(bool); return ok },
	"true":        func(r *renderer, v any, _ []any) bool { return v == true },
	"false":       func(r *renderer, v any, _ []any) bool { return v == false },
	"integer":     func(r *renderer, v any, _ []any) bool { _, ok := v.(int64); return ok },
	"float":       func(r *renderer, v any, _ []any) bool { _, ok := v.(float64); return ok },
	"number":      testNumber,
	"string":      func(r *renderer, v any, _ []any) bool { _, ok := v.(string); return ok },
	"mapping":     func(r *renderer, v any, _ []any) bool { _, ok := v.(*DictVal); return ok },
	"iterable":    testIterable,
	"sequence":    testIterable,
	"callable":    func(r *renderer, v any, _ []any) bool { _, ok := v.(*callable); return ok },
	"sameas":      testSameas,
	"escaped":     func(r *renderer, v any, _ []any) bool { return false },
	"odd":         testOdd,
	"even":        testEven,
	"divisibleby": testDivisibleby,
	"lower":       func(r *renderer, v any, _ []any) bool { s, ok := v.(string); return ok && s == pyLower(s) },
	"upper":       func(r *renderer, v any, _ []any) bool { s, ok := v.(string); return ok && s == pyUpper(s) },
	"in":          testIn,
	"eq":          testCompare("=="), "equalto": testCompare("=="), "==": testCompare("=="),
	"ne": testCompare("!="), "!=": testCompare("!="),
	"lt": testCompare("<"), "lessthan": testCompare("<"), "<": testCompare("<"),
	"le": testCompare("<="), "<=": testCompare("<="),
	"gt": testCompare(">"), "greaterthan": testCompare(">"), ">": testCompare(">"),
	"ge": testCompare(">="), ">=": testCompare(">="),
}

func testCompare(op string) testFn {
	return func(r *renderer, v any, args []any) bool {
		if len(args) != 1 {
			throw("test needs one argument")
		}
		return compareOp(op, v, args[0])
	}
}

func testNumber(r *renderer, v any, _ []any) bool {
	switch v.(type) {
	case int64, float64, bool:
		return true
	}
	return false
}

// testIterable serves both "iterable" and "sequence": every iterable value
// a template can hold also has a length and items.
func testIterable(r *renderer, v any, _ []any) bool {
	switch v.(type) {
	case string, *ListVal, *DictVal, Undefined:
		return true
	}
	return false
}

func testSameas(r *renderer, v any, args []any) bool {
	if len(args) != 1 {
		throw("sameas needs one argument")
	}
	switch v.(type) {
	case nil, bool, *ListVal, *DictVal, *Namespace:
		return v == args[0] // identity
	}
	return equal(v, args[0]) && typeName(v) == typeName(args[0])
}

func testOdd(r *renderer, v any, _ []any) bool {
	i, ok := intOf(v)
	if !ok {
		throw("odd expects an integer")
	}
	return i%2 != 0
}

func testEven(r *renderer, v any, _ []any) bool {
	i, ok := intOf(v)
	if !ok {
		throw("even expects an integer")
	}
	return i%2 == 0
}

func testDivisibleby(r *renderer, v any, args []any) bool {
	if len(args) != 1 {
		throw("divisibleby needs one argument")
	}
	m := arith("%", v, args[0])
	return !Truthy(m)
}

func testIn(r *renderer, v any, args []any) bool {
	if len(args) != 1 {
		throw("in needs one argument")
	}
	return contains(args[0], v)
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
