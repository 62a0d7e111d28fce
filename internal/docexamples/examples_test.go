package docexamples

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/wait"
)

const (
	// exampleTimeout bounds one example so a hung one fails. Most run in a
	// second; the simulator's run whole scenarios through `go run` (~11
	// CPU-s for llm-d-73-capacity), and under `make test` they share 2
	// cores with every other package's tests: 20 s killed them there.
	exampleTimeout = 60 * time.Second
	// readmeMaxLines is the README's budget: what kvindex is, how to run
	// and test it, one example per request kind, links into docs/.
	readmeMaxLines = 250
)

// root is the repository root: the documents' paths and the examples'
// working directory.
var root string

func TestMain(m *testing.M) {
	flag.Parse()
	var err error
	if root, err = harness.FindRepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// A plain build even when the test runs under -race: the race-built
	// daemon takes over 20 s to load the Qwen3 tokenizer, and these tests
	// check what the documents say, not data races (internal/e2e and
	// internal/promises run the race-built daemon).
	os.Exit(harness.Main(m, harness.PlainBuild()))
}

// documents are the files whose examples must run: the README and docs/.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	sort.Strings(files[1:])
	return files
}

// TestDocExamples runs every marked example of every document against a
// daemon started as `make run` starts it (the Makefile's RUN_DEMO_ARGS), on
// free loopback ports. Each document gets its own daemons, so a document's
// examples may build on each other (publish, then score) but never on
// another document's.
func TestDocExamples(t *testing.T) {
	runArgs := makeRunArgs(t)
	total := 0
	for _, file := range documents(t) {
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		exs, err := Extract(file, string(text))
		if err != nil {
			t.Fatal(err)
		}
		total += len(exs)
		if len(exs) == 0 {
			continue
		}
		t.Run(file, func(ft *testing.T) {
			ft.Parallel()
			daemons := map[string]*harness.Daemon{}
			for _, ex := range exs {
				ft.Run(fmt.Sprintf("line%d", ex.Line), func(t *testing.T) {
					d := daemons[ex.Flags]
					if d == nil {
						// The document's test owns the daemon: it serves
						// every later example with the same flags.
						d = harness.StartConfig(t, harness.Config{Dir: root, Cleanup: ft.Cleanup,
							Flags: append(append([]string(nil), runArgs...), strings.Fields(ex.Flags)...)})
						daemons[ex.Flags] = d
					}
					runExample(t, d, ex)
				})
			}
		})
	}
	if total == 0 {
		t.Fatal("no document marks a runnable example")
	}
}

// TestReadmeLength keeps the README a front page: details go to docs/.
func TestReadmeLength(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move details into docs/", n, readmeMaxLines)
	}
}

// makeRunArgs reads the flags `make run` gives the daemon from the Makefile,
// so the examples run against exactly what the README tells users to start.
func makeRunArgs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var demo, run []string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RUN_DEMO_ARGS ?="); ok {
			demo = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(l, "RUN_ARGS ?="); ok {
			run = strings.Fields(v)
		}
	}
	if demo == nil {
		t.Fatal("Makefile: no `RUN_DEMO_ARGS ?=` line (the flags of `make run`)")
	}
	return append(demo, run...)
}

// ports maps the ports of `make run` to the test daemon's.
var ports = regexp.MustCompile(`\b(localhost|127\.0\.0\.1):(8080|50051|5557)\b`)

func rewrite(d *harness.Daemon, code string) string {
	return ports.ReplaceAllStringFunc(code, func(s string) string {
		switch s[strings.LastIndexByte(s, ':')+1:] {
		case "8080":
			return d.HTTP
		case "50051":
			return d.GRPC
		}
		return strings.TrimPrefix(d.ZMQ, "tcp://")
	})
}

// runExample runs one example with bash (errexit, pipefail) from the
// repository root, with the test's kvindexd first on PATH, then checks its
// output against the document.
func runExample(t *testing.T, d *harness.Daemon, ex Example) {
	requireTools(t, ex.Code)
	before := eventsApplied(d)
	ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", rewrite(d, ex.Code))
	cmd.Dir = root
	cmd.Env = append(harness.EnvWithoutKVIndex(), "PATH="+filepath.Dir(harness.Binary(t))+string(os.PathListSeparator)+
		goBin()+string(os.PathListSeparator)+os.Getenv("PATH"))
	// Its own process group, so a timeout ends the publisher or grpcurl
	// the example started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if err != nil {
		t.Fatalf("%s:%d: %v (after %v)\n--- example (as run)\n%s--- stdout\n%s--- stderr\n%s",
			ex.File, ex.Line, err, time.Since(start).Round(time.Millisecond), rewrite(d, ex.Code), stdout.String(), stderr.String())
	}
	if n := publishedEvents(ex.Code); n > 0 {
		waitApplied(t, d, before+n)
	}
	got, err := Values(stdout.String())
	if err != nil {
		t.Fatalf("%s:%d: %v\n--- stdout\n%s", ex.File, ex.Line, err, stdout.String())
	}
	var want []any
	if ex.Output != "" {
		if want, err = Values(ex.Output); err != nil {
			t.Fatalf("%s:%d: the output block is not JSON: %v", ex.File, ex.OutputLine, err)
		}
		if len(want) == 0 {
			t.Fatalf("%s:%d: the output block holds no JSON object or array", ex.File, ex.OutputLine)
		}
	}
	for i, v := range got {
		if IsError(v) && (i >= len(want) || !IsError(want[i])) {
			t.Errorf("%s:%d: the daemon answered an error: %s", ex.File, ex.Line, Compact(v))
		}
	}
	if want == nil {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%s:%d: printed %d JSON values, the output block at line %d shows %d\n--- stdout\n%s",
			ex.File, ex.Line, len(got), ex.OutputLine, len(want), stdout.String())
	}
	for i := range want {
		if err := Match(want[i], got[i]); err != nil {
			t.Errorf("%s:%d: output %d differs in shape from line %d's block: %v\n    got %s",
				ex.File, ex.Line, i+1, ex.OutputLine, err, Compact(got[i]))
		}
	}
}

// requireTools skips an example whose tools are missing, with the command
// that installs them; under CI (CI=true, as .ci/run sets) it fails instead,
// so no example goes unrun there.
func requireTools(t *testing.T, code string) {
	t.Helper()
	var missing []string
	if strings.Contains(code, "grpcurl") {
		if _, err := lookPath("grpcurl"); err != nil {
			missing = append(missing, "grpcurl (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest)")
		}
	}
	if strings.Contains(code, "kvpublisher.py") {
		if err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").Run(); err != nil {
			missing = append(missing, "python3-zmq and python3-msgpack for /usr/bin/python3 (hack/test-deps.sh)")
		}
	}
	for _, tool := range []string{"curl", "bash"} {
		if strings.Contains(code, tool) {
			if _, err := exec.LookPath(tool); err != nil {
				missing = append(missing, tool)
			}
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "example needs " + strings.Join(missing, ", ")
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// lookPath finds a tool on PATH or in `go env GOPATH`/bin, where
// `go install` puts it.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := filepath.Join(goBin(), name)
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}

func goBin() string {
	if b := os.Getenv("GOBIN"); b != "" {
		return b
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return ""
	}
	return filepath.Join(strings.TrimSpace(string(out)), "bin")
}

// publishedEvents counts the events of the kvpublisher.py batches an
// example sends (its JSON lines with "topic" and "events"), so the test can
// wait until the daemon applied them before the next example scores: a
// person typing the next command is slower than the apply path, a test is
// not.
func publishedEvents(code string) int {
	if !strings.Contains(code, "kvpublisher.py") {
		return 0
	}
	n := 0
	for _, l := range strings.Split(code, "\n") {
		var batch struct {
			Topic  *string          `json:"topic"`
			Events []map[string]any `json:"events"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(l)), &batch) == nil && batch.Topic != nil {
			n += len(batch.Events)
		}
	}
	return n
}

// eventsApplied is kvindexd_events_applied_total summed over its labels
// (0 while /metrics does not answer).
func eventsApplied(d *harness.Daemon) int {
	return int(harness.MetricIn(d.MetricsBody(), "kvindexd_events_applied_total"))
}

func waitApplied(t *testing.T, d *harness.Daemon, want int) {
	t.Helper()
	wait.Until(t, "the example's events applied", func() string {
		if got := eventsApplied(d); got < want {
			return fmt.Sprintf("the daemon applied %d events, want %d: the example's publisher did not reach it\n%s", got, want, d.Logs.String())
		}
		return ""
	})
}
