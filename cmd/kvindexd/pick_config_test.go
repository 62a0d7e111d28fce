package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPickConfig(t *testing.T) {
	c := Config{PickPolicy: "aibrix", SpecTTL: Duration(500 * time.Millisecond), HistoryTTL: Duration(-time.Second), HistoryCapacity: 10}
	pc, err := c.pickConfig()
	if err != nil || pc.DefaultPolicy != "aibrix" || pc.SpeculativeTTL != 500*time.Millisecond || pc.HistoryTTL != -time.Second || pc.HistoryCapacity != 10 {
		t.Fatalf("%+v %v", pc, err)
	}
	for _, bad := range []Config{{PickPolicy: "best"}} {
		if _, err := bad.pickConfig(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// Every duration option is one Duration type, parsed by the flag (or env,
// or config file) and checked against its range in one place.
func TestDurationOptions(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string // "" = accepted
	}{
		{[]string{"--speculative-ttl", "soon"}, "want a duration"},
		{[]string{"--speculative-ttl", "-1s", "--history-ttl", "0"}, ""},
		{[]string{"--pod-expiry", "0"}, ""},
		{[]string{"--pod-expiry", "-1s"}, "--pod-expiry -1s: must not be negative"},
		{[]string{"--zmq-handshake-timeout", "0"}, "--zmq-handshake-timeout 0s: want a positive duration"},
		{[]string{"--lease-ttl", "-3s"}, "--lease-ttl -3s: want a positive duration"},
		{[]string{"--prediction-window", "0s"}, "--prediction-window 0s: want a positive duration"},
		{[]string{"--discover-resync", "0"}, "--discover-resync 0s: want a positive duration"},
		{[]string{"--snapshot-interval", "0"}, "--snapshot-interval 0s: want a positive duration"},
		{[]string{"--http-idle-timeout", "-1s"}, "--http-idle-timeout -1s: must not be negative"},
	} {
		_, err := loadConfig(tc.args, noEnv, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	// every Duration field of Config is bound to a table row, its range
	var c Config
	var path string
	listed := map[uintptr]bool{}
	flagSet(&c, &path, io.Discard).VisitAll(func(f *flag.Flag) {
		if d, ok := f.Value.(*durationFlag); ok {
			listed[d.target()] = true
		}
	})
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := 0; i < v.NumField(); i++ {
			f, name := v.Field(i), path+v.Type().Field(i).Name
			switch {
			case f.Type() == reflect.TypeFor[Duration]():
				if !listed[f.Addr().Pointer()] {
					t.Errorf("Config.%s is a duration option bound to no option row (durationOpt)", name)
				}
			case f.Kind() == reflect.Struct:
				walk(f, name+".")
			}
		}
	}
	walk(reflect.ValueOf(&c).Elem(), "")
}
