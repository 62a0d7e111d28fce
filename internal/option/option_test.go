package option

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestIntBounds(t *testing.T) {
	o := Int{Name: "queue-size", Default: 8, Min: -1, Max: 10}
	for v, ok := range map[int64]bool{-2: false, -1: true, 0: true, 10: true, 11: false} {
		if err := o.Check(v); (err == nil) != ok {
			t.Errorf("Check(%d) = %v", v, err)
		}
	}
	if err := o.Check(11); err == nil || err.Error() != "--queue-size 11: out of range -1..10" {
		t.Errorf("message: %v", err)
	}
	if o.Or(0) != 8 || o.Or(3) != 3 || o.Or(-1) != -1 {
		t.Errorf("Or: %d %d %d", o.Or(0), o.Or(3), o.Or(-1))
	}
	if o.FormatDefault() != "8" {
		t.Errorf("FormatDefault %q", o.FormatDefault())
	}
}

func TestDurationRanges(t *testing.T) {
	for _, tc := range []struct {
		r       DurationRange
		ok      [3]bool // -1ns, 0, 1ns
		text    string
		message string
	}{
		{Positive, [3]bool{false, false, true}, "> 0", "want a positive duration"},
		{NonNegative, [3]bool{false, true, true}, ">= 0", "must not be negative"},
		{Any, [3]bool{true, true, true}, "any; negative = off", ""},
	} {
		o := Duration{Name: "d", Default: time.Second, Range: tc.r}
		for i, v := range []time.Duration{-1, 0, 1} {
			err := o.Check(v)
			if (err == nil) != tc.ok[i] || (err != nil && !strings.Contains(err.Error(), "--d "+v.String()+": "+tc.message)) {
				t.Errorf("range %d: Check(%v) = %v", tc.r, v, err)
			}
		}
		if o.RangeText() != tc.text {
			t.Errorf("range %d: RangeText %q", tc.r, o.RangeText())
		}
	}
	o := Duration{Default: 2 * time.Second}
	if o.Or(0) != 2*time.Second || o.Or(-time.Second) != -time.Second || o.FormatDefault() != "2s" {
		t.Errorf("Or / FormatDefault: %v %v %q", o.Or(0), o.Or(-time.Second), o.FormatDefault())
	}
}

func TestFloatBounds(t *testing.T) {
	o := Float{Name: "rate", Default: 0.01, Min: 0, Max: 1}
	for _, v := range []float64{0, 0.5, 1} {
		if err := o.Check(v); err != nil {
			t.Errorf("Check(%v) = %v", v, err)
		}
	}
	for _, v := range []float64{-0.001, 1.001, math.NaN()} {
		if err := o.Check(v); err == nil || !strings.Contains(err.Error(), "out of range 0..1") {
			t.Errorf("Check(%v) = %v", v, err)
		}
	}
	if o.FormatDefault() != "0.01" || o.Range() != "0..1" {
		t.Errorf("FormatDefault %q Range %q", o.FormatDefault(), o.Range())
	}
}
