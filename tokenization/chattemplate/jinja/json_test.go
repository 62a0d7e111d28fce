package jinja

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
)

// BenchmarkFromJSON decodes the parity conversations (messages, tool
// calls, tools: 15 KB) as one JSON array, the input shape a chat request
// hands FromJSON.
func BenchmarkFromJSON(b *testing.B) {
	lines, err := os.ReadFile("../testdata/parity/conversations.jsonl")
	if err != nil {
		b.Fatal(err)
	}
	data := append(append([]byte("["), bytes.ReplaceAll(bytes.TrimSpace(lines), []byte("\n"), []byte(",\n"))...), ']')
	if _, err := FromJSON(data); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromJSON(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFromJSON pins what Python's json.loads gives a chat template: key
// order with repeated keys, the int/float split, U+FFFD for bad text, and
// the inputs refused rather than rounded or recursed into.
func TestFromJSON(t *testing.T) {
	deep := func(n int, inner string) string {
		return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
	}
	for _, c := range []struct{ in, repr, err string }{
		{in: `{"b": 1, "a": 2, "b": 3}`, repr: `{'b': 3, 'a': 2}`},
		{in: `[1, -0, 1.0, 1e2, 1E-2, -0.0, 9223372036854775807]`, repr: `[1, 0, 1.0, 100.0, 0.01, -0.0, 9223372036854775807]`},
		{in: ` {"s": "\u00e9\ud83d\ude00\/", "t": true, "n": null} `, repr: `{'s': 'é😀/', 't': True, 'n': None}`},
		{in: `["\ud800", "\udc00\ud800x", "a` + "\xff" + `b"]`, repr: "['\ufffd', '\ufffd\ufffdx', 'a\ufffdb']"},
		{in: deep(1001, ""), repr: "depth 1001"},
		{in: deep(1000, "1"), repr: "depth 1000"},
		{in: deep(1002, ""), err: "nested deeper than 1000"},
		{in: deep(1001, "1"), err: "nested deeper than 1000"},
		{in: `9223372036854775808`, err: "does not fit in 64 bits"},
		{in: `1e400`, err: "out of range"},
		{in: `1 2`, err: "trailing data"},
		{in: ``, err: "unexpected end of input"},
		{in: `[1,`, err: "unexpected end of input"},
		{in: `{"a" 1}`, err: "invalid JSON at offset"},
		{in: `[1,]`, err: "invalid JSON at offset"},
	} {
		v, err := FromJSON([]byte(c.in))
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.HasPrefix(err.Error(), "invalid JSON at offset ") {
				t.Errorf("%.40q: got %v, want an error containing %q", c.in, err, c.err)
			}
		case err != nil:
			t.Errorf("%.40q: %v", c.in, err)
		default:
			got := ""
			if l, ok := v.(*ListVal); ok && strings.HasPrefix(c.repr, "depth") {
				n := 1
				for ; len(l.Items) > 0; n++ {
					if l, ok = l.Items[0].(*ListVal); !ok {
						break
					}
				}
				got = fmt.Sprintf("depth %d", n)
			} else {
				got = reprString(v)
			}
			if got != c.repr {
				t.Errorf("%.40q: got %.60s, want %.60s", c.in, got, c.repr)
			}
		}
	}
}
