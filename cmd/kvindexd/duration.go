package main

import (
	"errors"
	"fmt"
	"time"
)

// Duration is a time.Duration written as a Go duration string ("5s") in
// flags, env and config files. Every duration option of the daemon has this
// type; what range each accepts is one table, durationOptions, checked by
// validateDurations.
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

// durationRange is what values a duration option accepts.
type durationRange uint8

const (
	positive    durationRange = iota // > 0
	nonNegative                      // >= 0 (0 has the meaning its help gives)
	anyDuration                      // 0 = the default, negative = off
)

type durationOption struct {
	flag string
	d    *Duration
	rng  durationRange
}

// durationOptions lists every duration option with the range it accepts.
func (c *Config) durationOptions() []durationOption {
	return []durationOption{
		{"--zmq-handshake-timeout", &c.ZMQHandshakeTimeout, positive},
		{"--zmq-message-timeout", &c.ZMQMessageTimeout, positive},
		{"--zmq-evict-idle-after", &c.ZMQEvictIdleAfter, positive},
		{"--replay-timeout", &c.ReplayTimeout, positive},
		{"--rebuild-timeout", &c.RebuildTimeout, positive},
		{"--pod-expiry", &c.PodExpiry, nonNegative},
		{"--apply-stall-timeout", &c.ApplyStallTimeout, nonNegative},
		{"--lease-ttl", &c.LeaseTTL, positive},
		{"--prediction-window", &c.PredictionWindow, positive},
		{"--speculative-ttl", &c.SpecTTL, anyDuration},
		{"--history-ttl", &c.HistoryTTL, anyDuration},
		{"--discover-resync", &c.Discovery.Resync, positive},
		{"--snapshot-interval", &c.SnapshotInterval, positive},
		{"--snapshot-max-age", &c.SnapshotMaxAge, nonNegative},
		{"--http-read-header-timeout", &c.HTTPReadHeaderTimeout, nonNegative},
		{"--http-read-timeout", &c.HTTPReadTimeout, nonNegative},
		{"--http-write-timeout", &c.HTTPWriteTimeout, nonNegative},
		{"--http-idle-timeout", &c.HTTPIdleTimeout, nonNegative},
		{"--grpc-idle-timeout", &c.GRPCIdleTimeout, positive},
	}
}

// validateDurations checks every duration option against its range.
func (c *Config) validateDurations() error {
	for _, o := range c.durationOptions() {
		v := time.Duration(*o.d)
		switch {
		case o.rng == positive && v <= 0:
			return fmt.Errorf("%s %v: want a positive duration", o.flag, v)
		case o.rng == nonNegative && v < 0:
			return fmt.Errorf("%s %v: must not be negative", o.flag, v)
		}
	}
	return nil
}
