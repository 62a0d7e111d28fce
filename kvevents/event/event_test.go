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

// Issue 32: SGLang's HiCache tier names (sgl-project/sglang PR #18205,
// disaggregation/kv_events.py MEDIUM_CPU_TIER1/2) are known media: L2 host
// memory is the pod's CPU tier, L3 (the storage backend) external.
func TestSGLangHiCacheTiers(t *testing.T) {
	for medium, want := range map[string]Tier{"CPU_TIER1": TierCPU, "cpu_tier1": TierCPU, "CPU_TIER2": TierExternal} {
		got, known := LookupTier(medium)
		if got != want || !known {
			t.Errorf("LookupTier(%q) = %v, %v; want %v, known", medium, got, known, want)
		}
	}
}
