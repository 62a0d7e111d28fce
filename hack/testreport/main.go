// Command testreport runs `go test -json ...` and prints what plain go test
// prints (a line per package, the output of failing tests), followed by every
// skipped test with its reason. Plain `go test ./...` hides why a test
// skipped (a missing redis-server, tokenizer files, chromium...); `make test`
// runs through this so a skip is never silent.
//
//	go run ./hack/testreport -- go test -json -race ./...
//
// It exits non-zero when the command fails or any test or build fails.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Elapsed    float64
	Output     string
}

// maxBuffered bounds the output kept per test: a chatty passing test must
// not hold memory until the run ends.
const maxBuffered = 1 << 20

type report struct {
	out     io.Writer
	buf     map[string]*strings.Builder // package + "\x00" + test -> output
	skips   map[string][]string         // reason -> "package Test"
	failed  bool
	results int
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testreport -- go test -json [flags] [packages]")
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r := &report{out: os.Stdout, buf: map[string]*strings.Builder{}, skips: map[string][]string{}}
	r.read(stdout)
	runErr := cmd.Wait()
	r.printSkips()
	if runErr != nil || r.failed || r.results == 0 {
		if runErr != nil {
			fmt.Fprintln(os.Stderr, "testreport:", strings.Join(args, " "), ":", runErr)
		}
		os.Exit(1)
	}
}

func (r *report) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintln(r.out, string(line)) // not JSON: pass it on
			continue
		}
		r.handle(&e)
	}
}

func (r *report) handle(e *event) {
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
	case "build-fail":
		r.failed = true
	case "output":
		b := r.buf[key]
		if b == nil {
			b = &strings.Builder{}
			r.buf[key] = b
		}
		if b.Len() < maxBuffered {
			b.WriteString(e.Output)
		}
	case "fail":
		r.failed = true
		fmt.Fprint(r.out, r.take(key))
		if e.Test == "" {
			r.results++
		}
	case "pass", "skip":
		out := r.take(key)
		switch {
		case e.Test == "" && e.Action == "skip":
			r.results++
			fmt.Fprint(r.out, out) // "?   pkg [no test files]"
		case e.Test == "":
			r.results++
			// The package summary line is the last output line ("ok ...").
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			fmt.Fprintln(r.out, lines[len(lines)-1])
		case e.Action == "skip":
			reason := skipReason(out)
			r.skips[reason] = append(r.skips[reason], e.Package+" "+e.Test)
		}
	}
}

func (r *report) take(key string) string {
	b := r.buf[key]
	delete(r.buf, key)
	if b == nil {
		return ""
	}
	return b.String()
}

// skipReason is the message a test gave t.Skip: the output line after
// "--- SKIP", without its file:line prefix.
func skipReason(out string) string {
	var reason []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "!!!") {
			continue
		}
		if _, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(l[:len(l)-len(msg)], ".go:") {
			l = msg
		}
		reason = append(reason, l)
	}
	if len(reason) == 0 {
		return "(no reason given)"
	}
	return reason[len(reason)-1]
}

func (r *report) printSkips() {
	if len(r.skips) == 0 {
		return
	}
	reasons := make([]string, 0, len(r.skips))
	n := 0
	for k, v := range r.skips {
		reasons = append(reasons, k)
		n += len(v)
	}
	sort.Strings(reasons)
	fmt.Fprintf(r.out, "\nSKIPPED: %d tests, for %d reasons:\n", n, len(reasons))
	for _, k := range reasons {
		tests := r.skips[k]
		sort.Strings(tests)
		more := ""
		if len(tests) > 3 {
			more = fmt.Sprintf(" and %d more", len(tests)-3)
			tests = tests[:3]
		}
		fmt.Fprintf(r.out, "  %s\n      %s%s\n", k, strings.Join(tests, ", "), more)
	}
}
