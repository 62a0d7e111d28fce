package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/kvindex/kvindex/api"
)

// version and commit are stamped at link time by make build and the
// Dockerfile:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=0123abc" ./cmd/kvindexd
//
// Unstamped (go run, go install), buildInfo falls back on what the go
// command recorded in the binary.
var version, commit string

// buildInfo is the running binary's version, commit and Go version: the
// stamped values first, then the module version (go install ...@v1.2.3) and
// the VCS revision go build records in a git checkout ("-dirty" with local
// changes), else "devel" and "unknown".
func buildInfo() api.BuildInfo {
	b := api.BuildInfo{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		if b.Commit == "" {
			var rev string
			var modified bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if rev != "" && modified {
				rev += "-dirty"
			}
			b.Commit = rev
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func runVersion(args []string, _ io.Reader, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("kvindexd version", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kvindexd version (or kvindexd --version)\n\nPrints the version, VCS commit and Go version of this binary.")
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	b := buildInfo()
	_, err := fmt.Fprintf(stdout, "kvindexd %s\ncommit:     %s\ngo version: %s\n", b.Version, b.Commit, b.GoVersion)
	return err
}
