package redistest

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

var nsSeq atomic.Int64

// UniqueNS is a key namespace of t's own, so tests and subtests can share
// one server without seeing each other's keys: a sequence number (a test
// run twice with -count gets a fresh one) and t's name.
func UniqueNS(t testing.TB) string {
	return fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
}
