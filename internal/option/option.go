// Package option declares a tunable once: its name, default, range and help
// text. Each part of the daemon (kvevents, the indexer, api, prefixstore,
// discovery) keeps a table of these beside its Config; that part's
// DefaultConfig, its validation and the resolution of a zero field read the
// table, and cmd/kvindexd builds its flags, their help and
// docs/configuration.md from the same rows. So a default or a range is
// written in one place, and a test can check that the flag, the help and the
// library agree.
//
// The name is the daemon's flag without dashes; its environment variable and
// config-file key derive from it. Errors name the option the way an operator
// sets it ("--queue-size 5000000: out of range 0..1048576").
package option

import (
	"fmt"
	"strconv"
	"time"
)

// Int is an integer option; Min and Max are included in its range.
type Int struct {
	Name     string
	Default  int64
	Min, Max int64
	Help     string
}

// Check says why v is outside the option's range (nil when it is not).
func (o Int) Check(v int64) error {
	if v < o.Min || v > o.Max {
		return fmt.Errorf("--%s %d: out of range %s", o.Name, v, o.Range())
	}
	return nil
}

// Or is v, or the default when v is 0 (a library Config's unset field).
func (o Int) Or(v int64) int64 {
	if v == 0 {
		return o.Default
	}
	return v
}

// Range is the accepted range as configuration.md shows it.
func (o Int) Range() string { return fmt.Sprintf("%d..%d", o.Min, o.Max) }

// FormatDefault is the default as a flag prints it.
func (o Int) FormatDefault() string { return strconv.FormatInt(o.Default, 10) }

// DurationRange is what values a duration option accepts.
type DurationRange uint8

const (
	// Positive: > 0.
	Positive DurationRange = iota
	// NonNegative: >= 0; what 0 means is in the option's help.
	NonNegative
	// Any: negative turns the feature off.
	Any
)

// Duration is a duration option.
type Duration struct {
	Name    string
	Default time.Duration
	Range   DurationRange
	Help    string
}

// Check says why v is outside the option's range (nil when it is not).
func (o Duration) Check(v time.Duration) error {
	switch {
	case o.Range == Positive && v <= 0:
		return fmt.Errorf("--%s %v: want a positive duration", o.Name, v)
	case o.Range == NonNegative && v < 0:
		return fmt.Errorf("--%s %v: must not be negative", o.Name, v)
	}
	return nil
}

// Or is v, or the default when v is 0 (a library Config's unset field).
func (o Duration) Or(v time.Duration) time.Duration {
	if v == 0 {
		return o.Default
	}
	return v
}

// RangeText is the accepted range as configuration.md shows it.
func (o Duration) RangeText() string {
	switch o.Range {
	case Positive:
		return "> 0"
	case NonNegative:
		return ">= 0"
	}
	return "any; negative = off"
}

// FormatDefault is the default as a flag prints it.
func (o Duration) FormatDefault() string { return o.Default.String() }

// Float is a floating-point option; Min and Max are included in its range.
type Float struct {
	Name     string
	Default  float64
	Min, Max float64
	Help     string
}

// Check says why v is outside the option's range (nil when it is not).
func (o Float) Check(v float64) error {
	if !(v >= o.Min && v <= o.Max) { // NaN fails too
		return fmt.Errorf("--%s %v: out of range %s", o.Name, v, o.Range())
	}
	return nil
}

// Range is the accepted range as configuration.md shows it.
func (o Float) Range() string { return fmt.Sprintf("%v..%v", o.Min, o.Max) }

// FormatDefault is the default as a flag prints it.
func (o Float) FormatDefault() string { return strconv.FormatFloat(o.Default, 'g', -1, 64) }
