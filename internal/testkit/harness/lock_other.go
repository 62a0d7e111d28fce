//go:build !unix

package harness

// heavyLock: elsewhere heavy tests are serialized within a test binary only.
func heavyLock() (func(), error) { return func() {}, nil }
