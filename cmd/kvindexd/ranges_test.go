package main

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/option"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/discovery"
	"github.com/kvindex/kvindex/prefixstore"
)

// serveFlags is serve's flag set over DefaultConfig.
func serveFlags() *flag.FlagSet {
	cfg := DefaultConfig()
	var path string
	return flagSet(&cfg, &path, io.Discard)
}

// rowOf is the table row an option flag is bound to.
func rowOf(f *flag.Flag) (name, help string, ok bool) {
	switch v := f.Value.(type) {
	case *intFlag[int]:
		return v.row.Name, v.row.Help, true
	case *intFlag[int64]:
		return v.row.Name, v.row.Help, true
	case *durationFlag:
		return v.row.Name, v.row.Help, true
	case *floatFlag:
		return v.row.Name, v.row.Help, true
	case *podShareFlag:
		return v.row.Name, v.row.Help, true
	}
	return "", "", false
}

// Every numeric flag of serve is bound to a row of its part's option table,
// and shows that row's name, help and default: no flag restates a default in
// its help or declares a default the table does not have.
func TestOptionFlagsAreTheTables(t *testing.T) {
	serveFlags().VisitAll(func(f *flag.Flag) {
		name, help, ok := rowOf(f)
		if !ok {
			if g, isGetter := f.Value.(flag.Getter); isGetter {
				switch reflect.ValueOf(g.Get()).Kind() {
				case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64, reflect.Float64:
					t.Errorf("--%s is numeric and bound to no option row (intOpt, int64Opt, floatOpt)", f.Name)
				}
			}
			if _, isDur := f.Value.(*Duration); isDur {
				t.Errorf("--%s is a duration bound to no option row (durationOpt)", f.Name)
			}
			return
		}
		o := f.Value.(optionFlag)
		if name != f.Name || optionUsage(o, help) != f.Usage {
			t.Errorf("--%s: flag name/help %q, row %q/%q", f.Name, f.Usage, name, help)
		}
		if f.DefValue != o.defaultText() {
			t.Errorf("--%s: DefaultConfig gives %s, the table's default is %s", f.Name, f.DefValue, o.defaultText())
		}
		if d := o.defaultText(); len(d) > 1 && strings.Contains(help, d) {
			t.Errorf("--%s: the help %q restates the default %s (the flag shows it)", f.Name, help, d)
		}
		if err := o.check(); err != nil {
			t.Errorf("--%s: the table's default is outside its own range: %v", f.Name, err)
		}
	})
}

// The table's range is exactly what serve accepts: each bound loads, one past
// it is refused with the table's own message. A check stricter than the
// table anywhere else in the daemon fails the first half; a bound the table
// states but nothing checks fails the second.
func TestOptionRangesAreChecked(t *testing.T) {
	env := func(string) string { return "" }
	// The one relation between options: the in-flight prompt budget holds at
	// least one prompt of the largest size.
	companion := map[string][]string{
		"max-prompt-bytes":            {"--tokenize-max-inflight-bytes", strconv.Itoa(1 << 32)},
		"tokenize-max-inflight-bytes": {"--max-prompt-bytes", "1"},
	}
	load := func(name, v string) error {
		_, err := loadConfig(append([]string{"--" + name, v}, companion[name]...), env, io.Discard)
		return err
	}
	accept := func(name, v string) {
		if err := load(name, v); err != nil {
			t.Errorf("--%s %s, within the table's range: %v", name, v, err)
		}
	}
	refuse := func(name, v string, want error) {
		if err := load(name, v); err == nil || !strings.Contains(err.Error(), want.Error()) {
			t.Errorf("--%s %s: %v, want the table's %q", name, v, err, want)
		}
	}
	serveFlags().VisitAll(func(f *flag.Flag) {
		switch v := f.Value.(type) {
		case *intFlag[int]:
			intBounds(v.row, accept, refuse)
		case *intFlag[int64]:
			intBounds(v.row, accept, refuse)
		case *podShareFlag:
			intBounds(v.row, accept, refuse)
			accept(f.Name, "auto")
		case *floatFlag:
			accept(f.Name, strconv.FormatFloat(v.row.Min, 'g', -1, 64))
			accept(f.Name, strconv.FormatFloat(v.row.Max, 'g', -1, 64))
			refuse(f.Name, strconv.FormatFloat(v.row.Max+0.5, 'g', -1, 64), v.row.Check(v.row.Max+0.5))
			refuse(f.Name, strconv.FormatFloat(v.row.Min-0.5, 'g', -1, 64), v.row.Check(v.row.Min-0.5))
		case *durationFlag:
			r := v.row
			accept(f.Name, time.Hour.String())
			switch r.Range {
			case option.Positive:
				accept(f.Name, time.Nanosecond.String())
				refuse(f.Name, "0s", r.Check(0))
			case option.NonNegative:
				accept(f.Name, "0s")
				refuse(f.Name, "-1ns", r.Check(-1))
			case option.Any:
				accept(f.Name, "0s")
				accept(f.Name, "-1s")
			}
		}
	})
}

func intBounds(r option.Int, accept func(string, string), refuse func(string, string, error)) {
	accept(r.Name, strconv.FormatInt(r.Min, 10))
	accept(r.Name, strconv.FormatInt(r.Max, 10))
	refuse(r.Name, strconv.FormatInt(r.Max+1, 10), r.Check(r.Max+1))
	refuse(r.Name, strconv.FormatInt(r.Min-1, 10), r.Check(r.Min-1))
}

// The values of issue 26 that panicked, hung or spun are start-up errors
// naming the flag.
func TestNumericFlagsOutOfRange(t *testing.T) {
	env := func(string) string { return "" }
	for _, bad := range [][]string{
		{"--workers", "9223372036854775807"},
		{"--queue-size", "9223372036854775807"},
		{"--key-cache-size", "9223372036854775807"},
		{"--digest-cache-size", "9223372036854775807"},
		{"--http-max-header-bytes", "9223372036854775807"},
		{"--workers", "-1"},
	} {
		_, err := loadConfig(bad, env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), bad[0]) || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("%v: %v, want an out-of-range error naming the flag", bad, err)
		}
	}
	if _, err := loadConfig([]string{"--workers", "1024", "--queue-size", "1048576", "--http-max-header-bytes", "16777216"}, env, io.Discard); err != nil {
		t.Errorf("the upper bounds: %v", err)
	}
}

// No code of the daemon orders an option's value against a bound of its own
// (`c.Workers < 0`): its range is its table row's, checked by validateRanges.
// The fields are found through the flags bound to rows, so a new option is
// covered the day it gets its flag.
func TestNoRangeCheckOutsideTheTables(t *testing.T) {
	cfg := DefaultConfig()
	var path string
	targets := map[uintptr]bool{}
	flagSet(&cfg, &path, io.Discard).VisitAll(func(f *flag.Flag) {
		if o, ok := f.Value.(optionFlag); ok {
			targets[o.target()] = true
		}
	})
	names := map[string]bool{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			// A struct shares its address with its first field: only
			// leaves are options.
			if f := v.Field(i); f.Kind() == reflect.Struct {
				walk(f)
			} else if targets[f.Addr().Pointer()] {
				names[v.Type().Field(i).Name] = true
			}
		}
	}
	walk(reflect.ValueOf(&cfg).Elem())
	if len(names) < len(targets) {
		t.Fatalf("found %d of the %d option fields", len(names), len(targets))
	}

	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			b, ok := n.(*ast.BinaryExpr)
			if !ok || (b.Op != token.LSS && b.Op != token.LEQ && b.Op != token.GTR && b.Op != token.GEQ) {
				return true
			}
			for _, x := range []ast.Expr{b.X, b.Y} {
				if name := optionField(x); names[name] {
					t.Errorf("%s: %s is compared by hand; its range belongs in its table row", fset.Position(b.Pos()), name)
				}
			}
			return true
		})
	}
}

// optionField is the field x reads, through conversions, parentheses and
// dereferences ("" when x is not a field).
func optionField(x ast.Expr) string {
	for {
		switch e := x.(type) {
		case *ast.ParenExpr:
			x = e.X
		case *ast.StarExpr:
			x = e.X
		case *ast.CallExpr:
			if len(e.Args) != 1 {
				return ""
			}
			x = e.Args[0]
		case *ast.SelectorExpr:
			return e.Sel.Name
		default:
			return ""
		}
	}
}

// Each part's DefaultConfig passes its own validation, and what the daemon
// hands each library from its DefaultConfig passes the library's: the
// libraries check the same rows the flags do.
func TestLibraryDefaultsValidate(t *testing.T) {
	dc := discovery.DefaultConfig()
	dc.Selector = "app=vllm"
	for name, err := range map[string]error{
		"kvevents.DefaultConfig":    kvevents.ValidateConfig(kvevents.DefaultConfig()),
		"indexer.DefaultConfig":     indexer.ValidateConfig(indexer.DefaultConfig()),
		"prefixstore.DefaultConfig": prefixstore.ValidateConfig(prefixstore.DefaultConfig()),
		"api.DefaultHTTPLimits":     api.ValidateHTTPLimits(api.DefaultHTTPLimits()),
		"applier.DefaultLimits":     applier.ValidateConfig(applier.Config{Limits: applier.DefaultLimits()}),
		"discovery.DefaultConfig":   discovery.Validate(dc),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	cfg := DefaultConfig()
	if err := kvevents.ValidateConfig(cfg.eventsConfig()); err != nil {
		t.Errorf("the daemon's subscriber config: %v", err)
	}
	if err := api.ValidateHTTPLimits(cfg.httpLimits()); err != nil {
		t.Errorf("the daemon's HTTP limits: %v", err)
	}
	// A library refuses what the flag refuses, with the same words.
	bad := kvevents.DefaultConfig()
	bad.QueueSize = int(kvevents.Options.QueueSize.Max + 1)
	if err := kvevents.ValidateConfig(bad); err == nil || !strings.Contains(err.Error(), kvevents.Options.QueueSize.Check(int64(bad.QueueSize)).Error()) {
		t.Errorf("kvevents.ValidateConfig with QueueSize %d: %v", bad.QueueSize, err)
	}
}
