package promises

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/testkit/harness"
)

// promiseDocs are the documents whose tables name the promises' tests, and
// the sections of each that must hold a table with a `test` column: the
// bounds live with the threat model, the other guarantees on their own page.
var promiseDocs = map[string][]string{
	"docs/security.md": {"### Bearer tokens", "### HTTP server limits", "### Pick state", "### Prompt limits", "#### Transport limits",
		"#### State limits"},
	"docs/promises.md": {"## Guarantees"},
}

var testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")

// docTable is one markdown table with a `test` column.
type docTable struct {
	section string
	rows    [][]string // cells of the data rows
	col     int        // index of the test column
}

// testTables returns the tables of a markdown document that have a `test`
// column, with the heading each is under.
func testTables(doc string) []docTable {
	var out []docTable
	section := ""
	lines := strings.Split(doc, "\n")
	inCode := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if strings.HasPrefix(l, "#") {
			section = strings.TrimSpace(l)
			continue
		}
		if !strings.HasPrefix(l, "|") {
			continue
		}
		header := cells(l)
		t := docTable{section: section, col: -1}
		for j, c := range header {
			if c == "test" {
				t.col = j
			}
		}
		i += 2 // header and separator
		for ; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			t.rows = append(t.rows, cells(lines[i]))
		}
		if t.col >= 0 {
			out = append(out, t)
		}
	}
	return out
}

// cells splits a table row on unescaped pipes.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var out []string
	var cur strings.Builder
	for i := 0; i < len(row); i++ {
		if row[i] == '\\' && i+1 < len(row) && row[i+1] == '|' {
			cur.WriteString(`\|`)
			i++
			continue
		}
		if row[i] == '|' {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(row[i])
	}
	return append(out, strings.TrimSpace(cur.String()))
}

// packageTests are the Test functions declared in this package's test files.
func packageTests(t *testing.T) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				names[fn.Name.Name] = true
			}
		}
	}
	return names
}

// repoTests finds `func Name(` in the repository's other test files, for the
// unit tests a `—` row cites in its reason.
func repoTests(t *testing.T, root string, names []string) map[string]bool {
	t.Helper()
	found := map[string]bool{}
	if len(names) == 0 {
		return found
	}
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() && strings.HasPrefix(e.Name(), ".") && p != root {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, n := range names {
			if strings.Contains(string(b), "func "+n+"(") {
				found[n] = true
			}
		}
		return nil
	})
	return found
}

// TestEveryPromiseHasATest keeps the documented limits and the suite from
// drifting apart: every row of a table with a `test` column names an
// existing test of this package (or says `—` with a reason), every listed
// section has such a table, and every TestPromise* test is named by a row.
func TestEveryPromiseHasATest(t *testing.T) {
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ours := packageTests(t)
	named := map[string]bool{}
	var cited []string
	for doc, sections := range promiseDocs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		tables := testTables(string(b))
		for _, want := range sections {
			found := false
			for _, tb := range tables {
				found = found || tb.section == want
			}
			if !found {
				t.Errorf("%s: section %q has no table with a `test` column", doc, want)
			}
		}
		for _, tb := range tables {
			for _, row := range tb.rows {
				if tb.col >= len(row) {
					t.Errorf("%s %s: row %q has no test cell", doc, tb.section, row[0])
					continue
				}
				cell := row[tb.col]
				if reason, ok := strings.CutPrefix(cell, "—"); ok {
					reason = strings.TrimSpace(reason)
					if !strings.HasPrefix(reason, "(") || !strings.HasSuffix(reason, ")") || len(reason) < 20 {
						t.Errorf("%s %s: row %q says — without a reason in parentheses", doc, tb.section, row[0])
					}
					for _, m := range testName.FindAllStringSubmatch(reason, -1) {
						cited = append(cited, m[1])
					}
					continue
				}
				ms := testName.FindAllStringSubmatch(cell, -1)
				if len(ms) == 0 {
					t.Errorf("%s %s: row %q names no test", doc, tb.section, row[0])
				}
				for _, m := range ms {
					named[m[1]] = true
					if !ours[m[1]] {
						t.Errorf("%s %s: row %q names %s, which internal/promises does not declare", doc, tb.section, row[0], m[1])
					}
				}
			}
		}
	}
	found := repoTests(t, root, cited)
	for _, n := range cited {
		if !found[n] {
			t.Errorf("a reason cites %s, which no test file of the repository declares", n)
		}
	}
	for n := range ours {
		if strings.HasPrefix(n, "TestPromise") && !named[n] {
			t.Errorf("%s is named by no row of %v", n, keys(promiseDocs))
		}
	}
}

func keys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestWiringMutantsStillApply keeps hack/mutation/wiring.txt in step with the
// code it mutates: each mutant's text must occur exactly once in its file (a
// refactor that moves it would otherwise fail only in CI's mutation slice,
// after the whole suite), and each test pattern must name tests this package
// declares.
func TestWiringMutantsStillApply(t *testing.T) {
	root, err := harness.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	list, err := os.ReadFile(filepath.Join(root, "hack/mutation/wiring.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ours := packageTests(t)
	n := 0
	for i, line := range strings.Split(string(list), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n++
		f := strings.Split(line, "|")
		if len(f) != 5 {
			t.Errorf("wiring.txt:%d: %d fields, want 5 (file|text|replacement|tests|what)", i+1, len(f))
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, f[0]))
		if err != nil {
			t.Errorf("wiring.txt:%d: %v", i+1, err)
			continue
		}
		if c := strings.Count(string(src), f[1]); c != 1 {
			t.Errorf("wiring.txt:%d: %q occurs %d times in %s, want exactly once", i+1, f[1], c, f[0])
		}
		re, err := regexp.Compile(f[3])
		if err != nil {
			t.Errorf("wiring.txt:%d: test pattern %q: %v", i+1, f[3], err)
			continue
		}
		matched := false
		for name := range ours {
			matched = matched || re.MatchString(name)
		}
		if !matched {
			t.Errorf("wiring.txt:%d: test pattern %q matches no test of internal/promises", i+1, f[3])
		}
	}
	if n == 0 {
		t.Fatal("wiring.txt lists no mutants")
	}
}
