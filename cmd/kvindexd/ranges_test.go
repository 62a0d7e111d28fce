package main

import (
	"flag"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// Every integer flag of serve has a documented range.
func TestEveryNumericFlagHasARange(t *testing.T) {
	cfg := DefaultConfig()
	var path string
	fs := flagSet(&cfg, &path, io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		switch reflect.ValueOf(g.Get()).Kind() {
		case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
			if _, ok := numericRanges[f.Name]; !ok {
				t.Errorf("--%s is numeric and has no range in numericRanges", f.Name)
			}
		}
	})
	for name := range numericRanges {
		if fs.Lookup(name) == nil {
			t.Errorf("numericRanges names --%s, which serve does not have", name)
		}
	}
}

// The values of issue 26 that panicked, hung or spun, and one past each
// bound, are start-up errors naming the flag; the bounds themselves load.
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
	for name, r := range numericRanges {
		if strings.HasPrefix(name, "discover-") {
			continue // checked only with --discover-pods; see below
		}
		if _, err := loadConfig([]string{"--" + name, strconv.FormatInt(r.max+1, 10)}, env, io.Discard); err == nil {
			t.Errorf("--%s %d (max %d) loaded", name, r.max+1, r.max)
		}
		if r.min > -1 {
			if _, err := loadConfig([]string{"--" + name, strconv.FormatInt(r.min-1, 10)}, env, io.Discard); err == nil {
				t.Errorf("--%s %d (min %d) loaded", name, r.min-1, r.min)
			}
		}
	}
	if _, err := loadConfig([]string{"--workers", "1024", "--queue-size", "1048576", "--http-max-header-bytes", "16777216"}, env, io.Discard); err != nil {
		t.Errorf("the upper bounds: %v", err)
	}
}
