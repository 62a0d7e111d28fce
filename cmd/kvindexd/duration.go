package main

import (
	"errors"
	"time"
)

// Duration is a time.Duration written as a Go duration string ("5s") in
// flags, env and config files. Every duration option of the daemon has this
// type and is bound to a row of its part's option table (options.go), which
// holds its range.
type Duration time.Duration

func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 10s")
	}
	*d = Duration(v)
	return nil
}

func (d *Duration) String() string               { return time.Duration(*d).String() }
func (d *Duration) UnmarshalText(b []byte) error { return d.Set(string(b)) }
func (d Duration) MarshalText() ([]byte, error)  { return []byte(time.Duration(d).String()), nil }
