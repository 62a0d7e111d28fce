package blockkeys

import (
	"testing"

	"github.com/kvindex/kvindex/internal/tenant"
)

// TestHasherSetTenantModel: a tenant's copy of a configured model hashes
// with that model's configuration (its engines publish the same hashes),
// an unconfigured model's with the default, and the lookup does not
// allocate (it runs per query).
func TestHasherSetTenantModel(t *testing.T) {
	set, err := NewHasherSet(KeyConfig{Algo: AlgoSHA256, BlockSize: 16},
		map[string]KeyConfig{"org/big": {Algo: AlgoSHA256, BlockSize: 64}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"org/big":                           64,
		tenant.Model("team-a", "org/big"):   64,
		tenant.Model("team-a", "org/other"): 16,
		"org/other":                         16,
	} {
		if got := set.For(name).Config().BlockSize; got != want {
			t.Errorf("For(%q) block size %d, want %d", name, got, want)
		}
	}
	name := tenant.Model("team-a", "org/big")
	if n := testing.AllocsPerRun(100, func() { _ = set.For(name) }); n != 0 {
		t.Errorf("For allocates %v times per call", n)
	}
}
