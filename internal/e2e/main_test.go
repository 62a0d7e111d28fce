package e2e

import (
	"os"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
)

// TestMain: the memory bound is measured on the daemon as shipped, not
// race-built (whose shadow memory is not the daemon's).
func TestMain(m *testing.M) { os.Exit(harness.Main(m, harness.PlainBuild())) }
