// Package docexamples keeps the documentation's examples runnable: it finds
// the examples marked runnable in README.md and docs/*.md, and its test runs
// each one against a kvindexd it starts and compares the output's shape with
// the JSON the document shows.
//
// A runnable example is a fenced ```sh or ```bash block with the line
// `<!-- example -->` directly above its opening fence. The marker may name
// extra daemon flags: `<!-- example flags="--admin-api" -->`. A ```json
// block marked `<!-- output -->`, separated from the example's closing fence
// by blank lines only, gives the expected output: one JSON value per command
// that prints JSON, in order. Keys and JSON types are compared, not values
// (see Match).
//
// Examples are written against the ports `make run` serves (localhost:8080,
// localhost:50051, tcp://localhost:5557); the test rewrites them to its
// daemon's. An unmarked block is prose: it is never run.
package docexamples

import (
	"bufio"
	"fmt"
	"regexp"
	"strings"
)

// Example is one runnable block of a document.
type Example struct {
	File  string // path relative to the repository root
	Line  int    // line of the opening fence, 1-based
	Flags string // extra daemon flags from the marker ("" = none)
	Code  string // the block's text, without the fences
	// Output is the marked JSON block's text ("" = no expected output).
	Output     string
	OutputLine int
}

const (
	exampleMarker = "<!-- example"
	outputMarker  = "<!-- output -->"
)

var flagsAttr = regexp.MustCompile(`^<!-- example(?: flags="([^"]*)")? -->$`)

// Extract returns the marked examples of one Markdown document. A marker not
// followed by a fenced sh/bash block, an output marker not right after an
// example, or an unterminated fence is an error: a marker that silently
// marks nothing would let an example go stale unseen.
func Extract(file, text string) ([]Example, error) {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	var out []Example
	inFence := false
	var fence string
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if inFence {
			if l == fence {
				inFence = false
			}
			continue
		}
		if f, ok := fenceOpen(l); ok {
			inFence, fence = true, f
			continue
		}
		if l == outputMarker {
			return nil, fmt.Errorf("%s:%d: %s not directly after a runnable example", file, i+1, outputMarker)
		}
		if !strings.HasPrefix(l, exampleMarker) {
			continue
		}
		m := flagsAttr.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("%s:%d: malformed marker %q (want <!-- example --> or <!-- example flags=\"...\" -->)", file, i+1, l)
		}
		if i+1 >= len(lines) {
			return nil, fmt.Errorf("%s:%d: example marker at the end of the file", file, i+1)
		}
		open := strings.TrimSpace(lines[i+1])
		if open != "```sh" && open != "```bash" {
			return nil, fmt.Errorf("%s:%d: example marker not directly above a ```sh or ```bash block", file, i+1)
		}
		code, end, err := fenced(lines, i+1, file)
		if err != nil {
			return nil, err
		}
		ex := Example{File: file, Line: i + 2, Flags: m[1], Code: code}
		// The output block: blank lines, the marker, a ```json fence.
		j := end + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j < len(lines) && strings.TrimSpace(lines[j]) == outputMarker {
			if j+1 >= len(lines) || strings.TrimSpace(lines[j+1]) != "```json" {
				return nil, fmt.Errorf("%s:%d: output marker not directly above a ```json block", file, j+1)
			}
			outText, outEnd, err := fenced(lines, j+1, file)
			if err != nil {
				return nil, err
			}
			ex.Output, ex.OutputLine = outText, j+2
			end = outEnd
		}
		out = append(out, ex)
		i = end
	}
	if inFence {
		return nil, fmt.Errorf("%s: unterminated code fence", file)
	}
	return out, nil
}

// fenceOpen reports whether l opens a fenced block and returns the line
// that closes it.
func fenceOpen(l string) (string, bool) {
	for _, f := range []string{"```", "~~~"} {
		if strings.HasPrefix(l, f) {
			return f, true
		}
	}
	return "", false
}

// fenced returns the text between the fence opening at lines[open] and its
// closing line, and the index of the closing line.
func fenced(lines []string, open int, file string) (string, int, error) {
	var b strings.Builder
	for k := open + 1; k < len(lines); k++ {
		if strings.TrimSpace(lines[k]) == "```" {
			return b.String(), k, nil
		}
		b.WriteString(lines[k])
		b.WriteByte('\n')
	}
	return "", 0, fmt.Errorf("%s:%d: unterminated code fence", file, open+1)
}
