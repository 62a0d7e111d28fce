// Package deploy holds the container image recipe's and the chart's checks;
// it has no code of its own. CI cannot build images (no container runtime),
// so the Dockerfile is linted here instead: the rules below are the ones a
// reviewer would otherwise check by hand.
package deploy

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with its continuation lines
// joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

func parseDockerfile(src string) []instruction {
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(src, "\n") {
		line := strings.TrimSpace(raw)
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") { // a comment inside a continuation
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

var (
	digestRef    = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)
	versionTag   = regexp.MustCompile(`:v?\d+\.\d+(\.\d+)?[\w.-]*$`)
	goImageVer   = regexp.MustCompile(`^golang:(\d+)\.(\d+)(?:\.(\d+))?`)
	uidGID       = regexp.MustCompile(`^(\d+)(?::(\d+))?$`)
	remoteSource = regexp.MustCompile(`(?i)(https?|ftp|git)://|git@`)
)

// lintDockerfile returns every rule src breaks. goMod is the module's go
// directive version (the builder's Go must be at least that).
func lintDockerfile(src, goMod string, ports []string) []string {
	var errs []string
	bad := func(in instruction, format string, args ...any) {
		errs = append(errs, fmt.Sprintf("line %d (%s): %s", in.line, in.cmd, fmt.Sprintf(format, args...)))
	}
	ins := parseDockerfile(src)
	stages := map[string]bool{}
	nFrom, lastFrom := 0, -1
	cgoOff := false
	for i, in := range ins {
		switch in.cmd {
		case "FROM":
			nFrom++
			lastFrom = i
			f := strings.Fields(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			if len(f) == 0 {
				bad(in, "no image")
				continue
			}
			img := f[0]
			switch {
			case img == "scratch" || stages[strings.ToLower(img)]:
			case digestRef.MatchString(img), versionTag.MatchString(img) && !strings.Contains(img, "$"):
				if m := goImageVer.FindStringSubmatch(img); m != nil && goMod != "" && !versionAtLeast(m[1:], goMod) {
					bad(in, "builder %s is older than go.mod's go %s", img, goMod)
				}
			default:
				bad(in, "base image %q is not pinned (use an exact version tag or a @sha256 digest)", img)
			}
			// A stage's name is visible to later FROMs only.
			if len(f) >= 3 && strings.EqualFold(f[1], "AS") {
				stages[strings.ToLower(f[2])] = true
			}
		case "ADD":
			if remoteSource.MatchString(in.args) {
				bad(in, "ADD of a URL (download in a RUN step with a checksum, or COPY)")
			}
		case "HEALTHCHECK":
			bad(in, "HEALTHCHECK in the image: Kubernetes probes /healthz and /readyz")
		case "RUN":
			if strings.Contains(in.args, "go build") && strings.Contains(in.args, "CGO_ENABLED=0") {
				cgoOff = true
			}
		}
	}
	if nFrom < 2 {
		errs = append(errs, "not a multi-stage build (build in one stage, copy the binary into a minimal one)")
	}
	if !cgoOff {
		errs = append(errs, "no RUN builds with CGO_ENABLED=0 (the binary must be static)")
	}
	if lastFrom < 0 {
		return errs
	}
	final := ins[lastFrom:]
	var user, entry string
	exposed := map[string]bool{}
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				exposed[strings.TrimSuffix(p, "/tcp")] = true
			}
		}
	}
	m := uidGID.FindStringSubmatch(user)
	switch {
	case user == "":
		errs = append(errs, "the final stage has no USER (it would run as root)")
	case m == nil:
		errs = append(errs, fmt.Sprintf("USER %q is not numeric (Kubernetes runAsNonRoot can only verify a numeric uid)", user))
	case m[1] == "0" || m[2] == "0":
		errs = append(errs, fmt.Sprintf("USER %q is root", user))
	}
	if !strings.HasPrefix(entry, "[") {
		errs = append(errs, "ENTRYPOINT is not in exec form (an empty image has no shell)")
	}
	for _, p := range ports {
		if !exposed[p] {
			errs = append(errs, "port "+p+" is not EXPOSEd by the final stage")
		}
	}
	return errs
}

// versionAtLeast compares [major, minor, patch] strings with a go.mod go
// version such as 1.26.0.
func versionAtLeast(have []string, want string) bool {
	w := strings.Split(want, ".")
	for i := range 3 {
		var h, x int
		if i < len(have) && have[i] != "" {
			h, _ = strconv.Atoi(have[i])
		}
		if i < len(w) {
			x, _ = strconv.Atoi(w[i])
		}
		if h != x {
			return h > x
		}
	}
	return true
}

func goModVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// defaultPorts are the daemon's default gRPC, HTTP and ZMQ bind ports
// (docs/configuration.md, cmd/kvindexd DefaultConfig).
var defaultPorts = []string{"50051", "8080", "5557"}

func TestDockerfileLint(t *testing.T) {
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if errs := lintDockerfile(string(src), goModVersion(t), defaultPorts); len(errs) > 0 {
		t.Fatalf("Dockerfile:\n%s", strings.Join(errs, "\n"))
	}
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", ".cache", "**/node_modules"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

// TestDockerfileLintCatches feeds the linter broken recipes: each must be
// reported for exactly its flaw.
func TestDockerfileLintCatches(t *testing.T) {
	good := `FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
RUN CGO_ENABLED=0 \
    go build -o /out/x ./cmd/x
FROM scratch
COPY --from=build /out/x /x
USER 65532:65532
EXPOSE 50051 8080 5557
ENTRYPOINT ["/x"]
`
	if errs := lintDockerfile(good, "1.26.0", defaultPorts); len(errs) > 0 {
		t.Fatalf("good recipe flagged: %v", errs)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"latest", "golang:1.26.8-bookworm", "golang:latest", "not pinned"},
		{"untagged", "FROM scratch", "FROM alpine", "not pinned"},
		{"old go", "golang:1.26.8-bookworm", "golang:1.25.3-bookworm", "older than go.mod"},
		{"single stage", "FROM scratch\nCOPY --from=build /out/x /x\n", "", "multi-stage"},
		{"root", "USER 65532:65532", "USER 0", "is root"},
		{"named user", "USER 65532:65532", "USER nobody", "not numeric"},
		{"no user", "USER 65532:65532\n", "", "no USER"},
		{"cgo", "CGO_ENABLED=0 \\\n", "", "CGO_ENABLED=0"},
		{"add url", "COPY --from=build /out/x /x", "ADD https://example.com/x /x", "ADD of a URL"},
		{"healthcheck", "EXPOSE", "HEALTHCHECK CMD [\"/x\", \"health\"]\nEXPOSE", "HEALTHCHECK"},
		{"port", "EXPOSE 50051 8080 5557", "EXPOSE 50051 8080", "5557"},
		{"shell entrypoint", `ENTRYPOINT ["/x"]`, "ENTRYPOINT /x", "exec form"},
	} {
		src := strings.Replace(good, tc.from, tc.to, 1)
		if src == good {
			t.Fatalf("%s: the replacement did not apply", tc.name)
		}
		errs := lintDockerfile(src, "1.26.0", defaultPorts)
		if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
			t.Errorf("%s: got %q, want one error containing %q", tc.name, errs, tc.want)
		}
	}
}
