package jinja

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// FuzzTemplate parses arbitrary templates and renders those that parse:
// neither step may panic (Render's last-resort recover reports an
// "internal template engine error", which counts as a failure here).
func FuzzTemplate(f *testing.F) {
	if fh, err := os.Open("testdata/snippets.jsonl"); err == nil {
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var s struct{ Template string }
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				f.Add(s.Template)
			}
		}
		fh.Close()
	}
	f.Add("{% for m in messages %}{{ m.content|trim }}{% endfor %}")
	varsJSON, err := os.ReadFile("testdata/snippets_vars.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Parse(src)
		if err != nil {
			if strings.Contains(err.Error(), "internal template") {
				t.Fatalf("parser panicked on %q: %v", src, err)
			}
			return
		}
		v, _ := FromJSON(varsJSON)
		d := v.(*DictVal)
		vars := map[string]any{}
		for i, k := range d.keys {
			vars[k.(string)] = d.vals[i]
		}
		_, err = tmpl.Render(Env{}, vars)
		if err != nil && strings.Contains(err.Error(), "internal template") {
			t.Fatalf("render panicked on %q: %v", src, err)
		}
	})
}

func TestDeepNestingIsAnError(t *testing.T) {
	for _, src := range []string{
		"{{ " + strings.Repeat("(", 10000) + "1" + strings.Repeat(")", 10000) + " }}",
		"{{ " + strings.Repeat("not ", 10000) + "1 }}",
		"{{ " + strings.Repeat("-", 10000) + "1 }}",
		"{{ " + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + " }}",
		strings.Repeat("{% if true %}", 10000) + strings.Repeat("{% endif %}", 10000),
		strings.Repeat("{% if x %}{% elif y %}", 10000) + "{% endif %}",
	} {
		if _, err := Parse(src); err == nil || !strings.Contains(err.Error(), "nested more than") {
			t.Errorf("%.30q...: %v", src, err)
		}
	}
}

func TestRunawayTemplatesFail(t *testing.T) {
	for _, src := range []string{
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
		"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
		"{% set x = 'a' * 60000000 %}{{ x ~ x ~ x }}",
		"{{ 'ab' * 10000000000 }}",
	} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tmpl.Render(Env{}, nil); err == nil {
			t.Errorf("%q rendered without error", src)
		}
	}
}

// FuzzFromJSON checks that FromJSON accepts exactly the JSON encoding/json
// accepts (apart from numbers it refuses to round: integers beyond 64 bits
// and floats beyond float64) and never panics.
func FuzzFromJSON(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2.5, -0, 1e3, "x\u00e9\ud83d\ude00", true, null]}`, `"\ud800"`, `[]`, `{"a":1,"a":2}`, `1e400`, `123456789012345678901234`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := FromJSON(data)
		valid := json.Valid(data)
		if err == nil && !valid {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if err != nil && valid && !strings.Contains(err.Error(), "range") && !strings.Contains(err.Error(), "64 bits") && !strings.Contains(err.Error(), "nested deeper") {
			t.Fatalf("rejected valid JSON %q: %v", data, err)
		}
	})
}

func TestRenderGoValues(t *testing.T) {
	tmpl, err := Parse("{{ m }} {{ l }} {{ s|join(',') }} {{ i + f }}")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(Env{}, map[string]any{
		"m": map[string]any{"b": 1, "a": []any{"x", nil, true}}, "l": []any{int32(1)}, "s": []string{"p", "q"}, "i": 2, "f": float32(0.5),
	})
	if err != nil || got != "{'a': ['x', None, True], 'b': 1} [1] p,q 2.5" {
		t.Errorf("got %q, %v", got, err)
	}
	if _, err := tmpl.Render(Env{}, map[string]any{"m": struct{}{}}); err == nil {
		t.Error("unsupported Go value accepted")
	}
}
