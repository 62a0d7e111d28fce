package docexamples

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink is an inline markdown link; its target is group 1.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks keeps the manual's cross references alive when a section
// moves: every relative link of the README and docs/ names a file that
// exists and, with a #fragment, a heading of that file.
func TestDocLinks(t *testing.T) {
	anchors := map[string]map[string]bool{} // file -> its headings' anchors
	for _, doc := range documents(t) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range proseLines(string(b)) {
			for _, m := range mdLink.FindAllStringSubmatch(l.text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, frag, _ := strings.Cut(target, "#")
				file := filepath.Join(filepath.Dir(doc), path)
				if path == "" {
					file = doc
				}
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s:%d: link %s: %s does not exist", doc, l.n, target, file)
					continue
				}
				if frag == "" {
					continue
				}
				if anchors[file] == nil {
					anchors[file] = headingAnchors(t, file)
				}
				if !anchors[file][frag] {
					t.Errorf("%s:%d: link %s: %s has no heading with anchor #%s", doc, l.n, target, file, frag)
				}
			}
		}
	}
}

type line struct {
	n    int
	text string
}

// proseLines are a document's lines outside fenced code blocks, where a
// `#` starts a comment and `](` is code, not a link.
func proseLines(doc string) []line {
	var out []line
	inCode := false
	for i, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			out = append(out, line{i + 1, l})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives the headings of a
// markdown file: lower case, punctuation dropped, spaces as hyphens, and
// -1, -2, ... on repeats.
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	if !strings.HasSuffix(file, ".md") {
		return out
	}
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, l := range proseLines(string(b)) {
		title, ok := strings.CutPrefix(strings.TrimLeft(l.text, "#"), " ")
		if !ok || !strings.HasPrefix(l.text, "#") {
			continue
		}
		a := slug(title)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for title, want := range map[string]string{
		"Restart without amnesia (in-memory index)":          "restart-without-amnesia-in-memory-index",
		"`kvindexd render`":                                  "kvindexd-render",
		"The ZMQ port (KV events)":                           "the-zmq-port-kv-events",
		"llm-d: `indexer.v1.IndexerService/GetPodScores`":    "llm-d-indexerv1indexerservicegetpodscores",
		"Prediction check: is kvindex computing the blocks?": "prediction-check-is-kvindex-computing-the-blocks",
		"Results, 8 pods x 2000 blocks — `--speedup 2`":      "results-8-pods-x-2000-blocks----speedup-2",
	} {
		if got := slug(title); got != want {
			t.Errorf("slug(%q) = %q, want %q", title, got, want)
		}
	}
}
