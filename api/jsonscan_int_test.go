package api

import (
	"strings"
	"testing"
)

// An integer too large for token_ids is refused with the number as the
// client sent it, also past 2^63 where a wrapped uint64 -> int64
// conversion would print another number (or the other sign).
func TestHugeTokenIDErrorQuotesTheNumberAsSent(t *testing.T) {
	for _, n := range []string{
		"4294967296", "-1", "9223372036854775807", "-9223372036854775807",
		"9223372036854775808", "9223372036854775810", "9223372036854775819",
		"-9223372036854775808", "-9223372036854775809", "-9223372036854775819",
		"18446744073709551615", "18446744073709551616", "99999999999999999999999",
	} {
		var sb scoreBody
		err := parseScoreBody([]byte(`{"model":"m","token_ids":[7,`+n+`,8]}`), &sb)
		if err == nil {
			t.Fatalf("token id %s accepted", n)
		}
		if want := "token_ids[1] = " + n + " is out of range"; !strings.Contains(err.Error(), want) {
			t.Fatalf("token id %s: error %q, want it to contain %q", n, err, want)
		}
	}
	// the largest id still fits
	var sb scoreBody
	if err := parseScoreBody([]byte(`{"model":"m","token_ids":[4294967295]}`), &sb); err != nil || len(sb.tokens) != 1 || sb.tokens[0] != 4294967295 {
		t.Fatalf("2^32-1: %v %v", sb.tokens, err)
	}
}
