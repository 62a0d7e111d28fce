package docexamples

import (
	"strings"
	"testing"
)

func TestExtract(t *testing.T) {
	doc := strings.Join([]string{
		"# Title",
		"",
		"```sh",
		"not marked: never run",
		"```",
		"<!-- example -->",
		"```sh",
		"curl -s localhost:8080/v1/pods",
		"```",
		"",
		"<!-- output -->",
		"```json",
		`{"pods": []}`,
		"```",
		"<!-- example flags=\"--admin-api\" -->",
		"```bash",
		"echo hi",
		"echo there",
		"```",
		"prose",
		"<!-- output -->",
		"",
	}, "\n")
	_, err := Extract("d.md", doc)
	if err == nil || !strings.Contains(err.Error(), "d.md:21") {
		t.Fatalf("an output marker after prose must be an error naming its line, got %v", err)
	}
	doc = strings.TrimSuffix(doc, "<!-- output -->\n")
	exs, err := Extract("d.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(exs) != 2 {
		t.Fatalf("got %d examples, want 2: %+v", len(exs), exs)
	}
	if e := exs[0]; e.Line != 7 || e.Code != "curl -s localhost:8080/v1/pods\n" || e.Output != "{\"pods\": []}\n" || e.OutputLine != 12 || e.Flags != "" {
		t.Errorf("first example: %+v", e)
	}
	if e := exs[1]; e.Line != 16 || e.Code != "echo hi\necho there\n" || e.Output != "" || e.Flags != "--admin-api" {
		t.Errorf("second example: %+v", e)
	}
}

func TestExtractRefusesMarkersThatMarkNothing(t *testing.T) {
	for name, doc := range map[string]string{
		"prose after marker":    "<!-- example -->\ntext\n```sh\necho\n```\n",
		"json block":            "<!-- example -->\n```json\n{}\n```\n",
		"blank line":            "<!-- example -->\n\n```sh\necho\n```\n",
		"marker at end":         "<!-- example -->",
		"malformed flags":       "<!-- example flags=--x -->\n```sh\necho\n```\n",
		"output not json":       "<!-- example -->\n```sh\necho\n```\n<!-- output -->\n```\n{}\n```\n",
		"lone output marker":    "text\n<!-- output -->\n```json\n{}\n```\n",
		"unterminated example":  "<!-- example -->\n```sh\necho\n",
		"unterminated anywhere": "```go\nfunc main() {}\n",
	} {
		if _, err := Extract("d.md", doc); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestValues(t *testing.T) {
	out := "ready\n{\"a\": 1}\n{\n  \"b\": [1,\n 2]\n}\ndone\n[3]\n"
	vals, err := Values(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 3 {
		t.Fatalf("got %d values: %v", len(vals), vals)
	}
	if _, err := Values("{\"a\": ...}\n"); err == nil {
		t.Error(`"..." in JSON must be an error`)
	}
}

func TestMatch(t *testing.T) {
	parse := func(s string) any {
		v, err := Values(s)
		if err != nil || len(v) != 1 {
			t.Fatalf("%q: %v %v", s, v, err)
		}
		return v[0]
	}
	ok := []struct{ want, got string }{
		{`{"a": 1, "b": "x"}`, `{"a": 2.5, "b": "y", "c": true}`},
		{`{"pods": [{"pod": "p", "tiers": {"gpu": 1}}, {"pod": "q", "tiers": {"cpu": 1}}]}`,
			`{"pods": [{"pod": "a", "tiers": {"gpu": 3}}, {"pod": "b", "tiers": {"cpu": 2}}, {"pod": "c", "tiers": {"cpu": 0}}]}`},
		{`{"x": null}`, `{"x": [1]}`},
		{`{"l": []}`, `{"l": [1, 2]}`},
	}
	for _, c := range ok {
		if err := Match(parse(c.want), parse(c.got)); err != nil {
			t.Errorf("Match(%s, %s): %v", c.want, c.got, err)
		}
	}
	bad := []struct{ want, got, where string }{
		{`{"a": 1}`, `{"b": 1}`, `$: key "a" missing`},
		{`{"a": 1}`, `{"a": "1"}`, `$.a: want a number, got string`},
		{`{"a": {"b": true}}`, `{"a": {"b": null}}`, `$.a.b: want a boolean, got null`},
		{`{"pods": [{"pod": "p"}]}`, `{"pods": []}`, `$.pods: want at least 1 elements, got 0`},
		{`{"pods": [{"pod": "p"}, {"tiers": {}}]}`, `{"pods": [{"pod": "p"}, {"pod": "q"}]}`, `$.pods[1]: key "tiers" missing`},
		{`[1]`, `{"a": 1}`, `$: want an array, got object`},
	}
	for _, c := range bad {
		err := Match(parse(c.want), parse(c.got))
		if err == nil || !strings.Contains(err.Error(), c.where) {
			t.Errorf("Match(%s, %s) = %v, want an error at %q", c.want, c.got, err, c.where)
		}
	}
}

func TestIsError(t *testing.T) {
	if !IsError(map[string]any{"error": "x", "code": "invalid_argument"}) {
		t.Error("the daemon's error shape not recognised")
	}
	if IsError(map[string]any{"error": "x"}) || IsError([]any{}) {
		t.Error("other shapes taken for an error")
	}
}
