package testkit

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoProductionImports: only tests, other scaffolding, the tools under
// hack/ and the benchmark harnesses under bench/ (which publish engine
// events as the tests do) import internal/testkit; the daemon, its
// libraries and the client never do.
func TestNoProductionImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/kvindex/kvindex/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const kit = "github.com/kvindex/kvindex/internal/testkit"
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		pkg := f[0]
		if strings.HasPrefix(pkg, kit) || strings.HasPrefix(pkg, "github.com/kvindex/kvindex/hack/") ||
			strings.HasPrefix(pkg, "github.com/kvindex/kvindex/bench/") {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, kit) {
				t.Errorf("%s imports %s outside its tests", pkg, imp)
			}
		}
	}
}
