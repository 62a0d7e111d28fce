package tenant

import (
	"strings"
	"testing"
)

// TestModelSplitsOneWay: an internal name made of a checked tenant and a
// checked model splits back into them, and never equals a model name a
// tenant API accepts (which holds no Sep).
func TestModelSplitsOneWay(t *testing.T) {
	for _, tc := range []struct{ tenant, model, want string }{
		{"", "org/m", "org/m"},
		{Default, "org/m", "org/m"},
		{"team-a", "org/m", `team-a\org/m`},
	} {
		got := Model(tc.tenant, tc.model)
		if got != tc.want {
			t.Errorf("Model(%q, %q) = %q, want %q", tc.tenant, tc.model, got, tc.want)
		}
		tn, m := Split(got)
		if m != tc.model || Base(got) != tc.model || (tc.tenant != "" && tn != tc.tenant) {
			t.Errorf("Split(%q) = %q, %q; Base %q", got, tn, m, Base(got))
		}
		if tc.tenant != "" && tc.tenant != Default && CheckModel(got) == nil {
			t.Errorf("CheckModel accepts the internal name %q", got)
		}
	}
	for _, bad := range []string{"", `a\b`, "a b", "a\tb", "a\x00", strings.Repeat("x", MaxLen+1)} {
		if Check(bad) == nil {
			t.Errorf("Check(%q) accepted", bad)
		}
	}
	for _, good := range []string{"default", "team-a", "t.1_2", "räum"} {
		if err := Check(good); err != nil {
			t.Errorf("Check(%q): %v", good, err)
		}
	}
}
