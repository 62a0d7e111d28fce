package event

import (
	"testing"
)

// Tier names: every tier has its own, anything past the last is "unknown".
func TestTierStringEdges(t *testing.T) {
	want := []string{"gpu", "cpu", "disk", "external", "shared"}
	for tier := Tier(0); tier < NumTiers; tier++ {
		if got := tier.String(); got != want[tier] {
			t.Errorf("Tier(%d).String() = %q, want %q", tier, got, want[tier])
		}
	}
	for _, tier := range []Tier{NumTiers, NumTiers + 1, 255} {
		if got := tier.String(); got != "unknown" {
			t.Errorf("Tier(%d).String() = %q, want unknown", tier, got)
		}
	}
}
