//go:build !race

package promises

// buildFlags: see race_test.go.
var buildFlags []string

// raceBuild: see race_test.go.
const raceBuild = false
