package main

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strconv"
	"time"

	"github.com/kvindex/kvindex/internal/option"
)

// Every numeric flag of serve is bound to a row of its part's option table
// (kvevents.Options, applier.Options, kvindex.MemoryOptions,
// indexer.Options, api.Options, prefixstore.Options, discovery.Options): the flag's name and help are the row's, DefaultConfig
// fills the field from the row's default (so the flag shows it), and
// validateRanges checks the value against the row's range. Nothing in this
// package restates a default or a range; TestOptionFlagsAreTheTables checks
// that.

// optionFlag is a flag bound to a table row.
type optionFlag interface {
	flag.Getter
	// check says why the value is outside the row's range.
	check() error
	// rangeText is the range configuration.md shows ("" for none).
	rangeText() string
	// defaultText is the row's default as the flag prints it.
	defaultText() string
	// target is the address of the Config field (gendocs' config key).
	target() uintptr
}

type integer interface{ ~int | ~int64 }

// intFlag binds an int or int64 field to an option.Int row.
type intFlag[T integer] struct {
	p   *T
	row option.Int
}

func (f *intFlag[T]) Set(s string) error {
	bits := 64
	if reflect.TypeFor[T]().Kind() == reflect.Int {
		bits = strconv.IntSize
	}
	n, err := strconv.ParseInt(s, 0, bits)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return errors.New("value out of range")
		}
		return errors.New("parse error")
	}
	*f.p = T(n)
	return nil
}

func (f *intFlag[T]) String() string {
	if f == nil || f.p == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*f.p), 10)
}

func (f *intFlag[T]) Get() any            { return *f.p }
func (f *intFlag[T]) check() error        { return f.row.Check(int64(*f.p)) }
func (f *intFlag[T]) rangeText() string   { return f.row.Range() }
func (f *intFlag[T]) defaultText() string { return f.row.FormatDefault() }
func (f *intFlag[T]) target() uintptr     { return reflect.ValueOf(f.p).Pointer() }

// durationFlag binds a Duration field to an option.Duration row.
type durationFlag struct {
	p   *Duration
	row option.Duration
}

func (f *durationFlag) Set(s string) error { return f.p.Set(s) }
func (f *durationFlag) String() string {
	if f == nil || f.p == nil {
		return time.Duration(0).String()
	}
	return f.p.String()
}
func (f *durationFlag) Get() any            { return time.Duration(*f.p) }
func (f *durationFlag) check() error        { return f.row.Check(time.Duration(*f.p)) }
func (f *durationFlag) defaultText() string { return f.row.FormatDefault() }
func (f *durationFlag) target() uintptr     { return reflect.ValueOf(f.p).Pointer() }
func (f *durationFlag) rangeText() string {
	if f.row.Range == option.Any {
		return "" // the help says what a negative value does
	}
	return f.row.RangeText()
}

// floatFlag binds a float64 field to an option.Float row.
type floatFlag struct {
	p   *float64
	row option.Float
}

func (f *floatFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("parse error")
	}
	*f.p = v
	return nil
}

func (f *floatFlag) String() string {
	if f == nil || f.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.p, 'g', -1, 64)
}

func (f *floatFlag) Get() any            { return *f.p }
func (f *floatFlag) check() error        { return f.row.Check(*f.p) }
func (f *floatFlag) rangeText() string   { return f.row.Range() }
func (f *floatFlag) defaultText() string { return f.row.FormatDefault() }
func (f *floatFlag) target() uintptr     { return reflect.ValueOf(f.p).Pointer() }

// The declarations: name, help and range from the row, the field's current
// value (DefaultConfig's, or the config file's) as the flag's default.
func intOpt(fs *flag.FlagSet, p *int, row option.Int) {
	declare(fs, &intFlag[int]{p, row}, row.Name, row.Help)
}

func int64Opt(fs *flag.FlagSet, p *int64, row option.Int) {
	declare(fs, &intFlag[int64]{p, row}, row.Name, row.Help)
}

func durationOpt(fs *flag.FlagSet, p *Duration, row option.Duration) {
	declare(fs, &durationFlag{p, row}, row.Name, row.Help)
}

func floatOpt(fs *flag.FlagSet, p *float64, row option.Float) {
	declare(fs, &floatFlag{p, row}, row.Name, row.Help)
}

func declare(fs *flag.FlagSet, v optionFlag, name, help string) {
	fs.Var(v, name, optionUsage(v, help))
}

// optionUsage is a row's help with its range, as -h and configuration.md
// show it.
func optionUsage(v optionFlag, help string) string {
	if r := v.rangeText(); r != "" {
		return help + " (range " + r + ")"
	}
	return help
}

// validateRanges checks every option flag's value against its row, reading
// the values through the flags bound to c (so a value from the config file
// or the environment is checked the same way).
func (c *Config) validateRanges() error {
	var configPath string
	fs := flagSet(c, &configPath, io.Discard)
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if o, ok := f.Value.(optionFlag); ok && err == nil {
			err = o.check()
		}
	})
	return err
}
