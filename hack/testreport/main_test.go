package main

import (
	"strings"
	"testing"
)

// A stream as `go test -json` writes it: one passing package with a skipped
// test, one failing test, and a package without tests.
const stream = `{"Action":"start","Package":"a"}
{"Action":"run","Package":"a","Test":"TestRedis"}
{"Action":"output","Package":"a","Test":"TestRedis","Output":"=== RUN   TestRedis\n"}
{"Action":"output","Package":"a","Test":"TestRedis","Output":"!!! SKIPPING REDIS TESTS: redis-server not found\n"}
{"Action":"output","Package":"a","Test":"TestRedis","Output":"    redistest.go:53: !!! SKIPPING REDIS TESTS: redis-server not found\n"}
{"Action":"output","Package":"a","Test":"TestRedis","Output":"--- SKIP: TestRedis (0.00s)\n"}
{"Action":"skip","Package":"a","Test":"TestRedis"}
{"Action":"run","Package":"a","Test":"TestOK"}
{"Action":"output","Package":"a","Test":"TestOK","Output":"quiet\n"}
{"Action":"pass","Package":"a","Test":"TestOK"}
{"Action":"output","Package":"a","Output":"PASS\n"}
{"Action":"output","Package":"a","Output":"ok  \ta\t0.01s\n"}
{"Action":"pass","Package":"a"}
{"Action":"run","Package":"b","Test":"TestBad"}
{"Action":"output","Package":"b","Test":"TestBad","Output":"    b_test.go:9: boom\n"}
{"Action":"fail","Package":"b","Test":"TestBad"}
{"Action":"output","Package":"b","Output":"FAIL\tb\t0.02s\n"}
{"Action":"fail","Package":"b"}
{"Action":"output","Package":"c","Output":"?   \tc\t[no test files]\n"}
{"Action":"skip","Package":"c"}
`

func TestReport(t *testing.T) {
	var out strings.Builder
	r := &report{out: &out, buf: map[string]*strings.Builder{}, skips: map[string][]string{}}
	r.read(strings.NewReader(stream))
	r.printSkips()
	got := out.String()
	for _, want := range []string{"ok  \ta\t0.01s\n", "b_test.go:9: boom", "FAIL\tb", "?   \tc\t[no test files]",
		"SKIPPED: 1 tests, for 1 reasons:\n  !!! SKIPPING REDIS TESTS: redis-server not found\n      a TestRedis\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
	if !r.failed || r.results != 3 {
		t.Errorf("failed=%v results=%d", r.failed, r.results)
	}
}
