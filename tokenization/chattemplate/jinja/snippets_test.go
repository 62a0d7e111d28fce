package jinja

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"
)

// The snippets exercise one engine feature each; snippets.golden.jsonl is
// what Debian's python3-jinja2, set up as transformers sets it up for chat
// templates, renders for them (hack/chat/gen_golden.py).

func TestSnippetsMatchJinja2(t *testing.T) {
	varsJSON, err := os.ReadFile("testdata/snippets_vars.json")
	if err != nil {
		t.Fatal(err)
	}
	type snippet struct {
		Name     string `json:"name"`
		Template string `json:"template"`
		Out      *string
		Raised   string `json:"raised"`
		Error    string `json:"error"`
	}
	read := func(path string) []snippet {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var out []snippet
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var s snippet
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	inputs := read("testdata/snippets.jsonl")
	golden := read("testdata/snippets.golden.jsonl")
	if len(inputs) != len(golden) || len(inputs) < 100 {
		t.Fatalf("%d snippets, %d goldens", len(inputs), len(golden))
	}
	env := Env{Now: func() time.Time { return time.Date(2026, 1, 15, 9, 30, 5, 0, time.UTC) }}
	equal := 0
	for i, in := range inputs {
		g := golden[i]
		vars, err := FromJSON(varsJSON)
		if err != nil {
			t.Fatal(err)
		}
		d := vars.(*DictVal)
		m := map[string]any{}
		for j, k := range d.keys {
			m[k.(string)] = d.vals[j]
		}
		got, err := func() (string, error) {
			tmpl, err := Parse(in.Template)
			if err != nil {
				return "", err
			}
			return tmpl.Render(env, m)
		}()
		switch {
		case g.Out != nil:
			if err != nil {
				t.Errorf("%s %q: %v", in.Name, in.Template, err)
				continue
			}
			if got != *g.Out {
				t.Errorf("%s %q:\n got: %q\nwant: %q", in.Name, in.Template, got, *g.Out)
				continue
			}
		case g.Raised != "":
			var re *RaisedError
			if !errors.As(err, &re) || re.Message != g.Raised {
				t.Errorf("%s: want raise_exception(%q), got %q, %v", in.Name, g.Raised, got, err)
				continue
			}
		default:
			if err == nil {
				t.Errorf("%s %q: want an error like %q, got %q", in.Name, in.Template, g.Error, got)
				continue
			}
		}
		equal++
	}
	t.Logf("%d/%d snippets equal to Jinja2", equal, len(inputs))
}

// TestRandomWhitespaceMatchesJinja2 runs 400 seeded random templates that
// mix text and whitespace with every tag kind and "-"/"+" marker
// (hack/chat/gen_golden.py random_whitespace_templates) against Jinja2's
// output: a differential test of the lexer's whitespace rules.
func TestRandomWhitespaceMatchesJinja2(t *testing.T) {
	f, err := os.Open("testdata/whitespace_random.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 1<<20)
	n, equal := 0, 0
	vars := map[string]any{"n": int64(5), "s": " s ", "r": "raw"}
	for sc.Scan() {
		var c struct {
			Name, Template string
			Out            *string
			Error          string
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		n++
		got, err := func() (string, error) {
			tmpl, err := Parse(c.Template)
			if err != nil {
				return "", err
			}
			return tmpl.Render(Env{}, vars)
		}()
		switch {
		case c.Out == nil && err == nil:
			t.Errorf("%s %q: Jinja2 failed (%s), we rendered %q", c.Name, c.Template, c.Error, got)
		case c.Out != nil && err != nil:
			t.Errorf("%s %q: %v", c.Name, c.Template, err)
		case c.Out != nil && got != *c.Out:
			t.Errorf("%s %q:\n got: %q\nwant: %q", c.Name, c.Template, got, *c.Out)
		default:
			equal++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 400 {
		t.Fatalf("only %d templates", n)
	}
	t.Logf("%d/%d random whitespace templates equal to Jinja2", equal, n)
}
