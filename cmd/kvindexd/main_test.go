package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// Help text is printed as written: the redactor, meant for logs and
// errors, used to turn the --index help into "redis://xxxxx@]host:port/db".
func TestHelpTextIsVerbatim(t *testing.T) {
	for _, args := range [][]string{{"help", "serve"}, {"serve", "--help"}, {"-h", "serve"}} {
		var stdout, stderr bytes.Buffer
		code := run(args, strings.NewReader(""), &stdout, &stderr)
		if code != 0 || stderr.Len() != 0 {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
		if want := "redis://[user:pass@]host:port/db"; !strings.Contains(stdout.String(), want) {
			t.Errorf("%q: the --index help lacks %q:\n%s", args, want, stdout.String())
		}
		if strings.Contains(stdout.String(), "xxxxx") {
			t.Errorf("%q: help text went through the redactor", args)
		}
	}
}

// A typo'd flag or a bad value prints the error and one line pointing to
// the subcommand's --help (not the whole flag list), exit status 2; a
// credential in the echoed value stays masked.
func TestBadFlagPrintsErrorAndHint(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		errLine string
		hint    string
	}{
		{[]string{"--grpc-adr", ":1"}, "kvindexd serve: flag provided but not defined: -grpc-adr", "Run 'kvindexd serve --help' for usage."},
		{[]string{"serve", "--workers", "many"}, `kvindexd serve: invalid value "many" for flag -workers: parse error`, "Run 'kvindexd serve --help' for usage."},
		{[]string{"serve", "stray"}, `kvindexd serve: unexpected arguments ["stray"]`, "Run 'kvindexd serve --help' for usage."},
		{[]string{"serve", "--endpoint", "tcp://u:s3cr3t@10.0.0.1:5557,colour=red"},
			`kvindexd serve: invalid value "tcp://xxxxx@10.0.0.1:5557,colour=red" for flag -endpoint: endpoint "tcp://xxxxx@10.0.0.1:5557,colour=red": unknown option "colour" (pod, model, engine, replay, snapshot, role)`,
			"Run 'kvindexd serve --help' for usage."},
		{[]string{"blockhash", "--sede", "0"}, "kvindexd blockhash: flag provided but not defined: -sede", "Run 'kvindexd blockhash --help' for usage."},
		{[]string{"version", "--short"}, "kvindexd version: flag provided but not defined: -short", "Run 'kvindexd version --help' for usage."},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, strings.NewReader(""), &stdout, &stderr)
		if want := tc.errLine + "\n" + tc.hint + "\n"; code != 2 || stdout.Len() != 0 || stderr.String() != want {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, no stdout, stderr:\n%s", tc.args, code, stdout.String(), stderr.String(), want)
		}
	}
}

func TestVersion(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "", ""
	var first string
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, strings.NewReader(""), &stdout, &stderr); code != 0 || stderr.Len() != 0 {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
		// A test binary carries no module version or VCS stamp.
		if want := "kvindexd devel\ncommit:     unknown\ngo version: " + runtime.Version() + "\n"; stdout.String() != want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", args, stdout.String(), want)
		}
		if first == "" {
			first = stdout.String()
		}
	}
	// The link-time stamps (make build, Dockerfile) win.
	version, commit = "v1.2.3-4-g0123abc", "0123abcdef"
	if b := buildInfo(); b.Version != version || b.Commit != commit || b.GoVersion != runtime.Version() {
		t.Errorf("stamped build info %+v", b)
	}
}
