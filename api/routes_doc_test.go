package api

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The package comment lists the HTTP routes; every route Handler registers
// must be in it, so the list cannot fall behind the code.
func TestPackageDocNamesEveryRoute(t *testing.T) {
	src, err := os.ReadFile("http.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("server.go")
	if err != nil {
		t.Fatal(err)
	}
	pkgDoc := strings.ReplaceAll(string(doc[:strings.Index(string(doc), "package api")]), "\n// ", " ")
	routes := regexp.MustCompile(`mux\.Handle(?:Func)?\("(?:GET|POST|DELETE) ([^"]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(routes) < 10 {
		t.Fatalf("found %d routes in http.go: the pattern no longer matches the code", len(routes))
	}
	for _, r := range routes {
		path := strings.TrimSuffix(r[1], "{$}")
		if path == "/" {
			if !strings.Contains(pkgDoc, "status page at /") {
				t.Errorf("package doc does not name the status page route /")
			}
			continue
		}
		if !regexp.MustCompile(regexp.QuoteMeta(path) + `[ ,)\n]`).MatchString(pkgDoc) {
			t.Errorf("package doc does not name route %s", path)
		}
	}
}
