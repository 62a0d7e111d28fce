package docexamples

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Values decodes every JSON object or array that starts a line of out, in
// order, and skips every other line (a publisher's "ready", a log line).
// Numbers are kept as json.Number.
func Values(out string) ([]any, error) {
	var vals []any
	rest := out
	for len(rest) > 0 {
		line, after, _ := strings.Cut(rest, "\n")
		t := strings.TrimLeft(line, " \t")
		if !strings.HasPrefix(t, "{") && !strings.HasPrefix(t, "[") {
			rest = after
			continue
		}
		dec := json.NewDecoder(strings.NewReader(rest))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("output line %q: %w", line, err)
		}
		vals = append(vals, v)
		rest = rest[dec.InputOffset():]
	}
	return vals, nil
}

// Match reports how actual differs in shape from expected, or nil. Shape
// means: an object has at least the expected keys (more are allowed: a
// document may show a subset), each with a value of the expected shape; an
// array has at least as many elements as expected, and element i has the
// shape of expected element min(i, len-1) (so one element documents all of a
// list); strings, numbers and booleans match their own kind whatever the
// value; an expected null matches anything.
func Match(expected, actual any) error {
	return match("$", expected, actual)
}

func match(path string, exp, act any) error {
	switch e := exp.(type) {
	case nil:
		return nil
	case map[string]any:
		a, ok := act.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", path, kind(act))
		}
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, ok := a[k]
			if !ok {
				return fmt.Errorf("%s: key %q missing (have %s)", path, k, keyList(a))
			}
			if err := match(path+"."+k, e[k], v); err != nil {
				return err
			}
		}
		return nil
	case []any:
		a, ok := act.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %s", path, kind(act))
		}
		if len(a) < len(e) {
			return fmt.Errorf("%s: want at least %d elements, got %d", path, len(e), len(a))
		}
		for i, v := range a {
			if len(e) == 0 {
				break
			}
			if err := match(fmt.Sprintf("%s[%d]", path, i), e[min(i, len(e)-1)], v); err != nil {
				return err
			}
		}
		return nil
	default:
		if kind(exp) != kind(act) {
			return fmt.Errorf("%s: want a %s, got %s", path, kind(exp), kind(act))
		}
		return nil
	}
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number, float64:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

func keyList(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return "[" + strings.Join(keys, " ") + "]"
}

// IsError reports whether v is the daemon's JSON error answer
// ({"error": ..., "code": ...}): an example that gets one is broken unless
// its document shows the error.
func IsError(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	_, e := m["error"]
	_, c := m["code"]
	return e && c
}

// Compact is v as one line of JSON, for messages.
func Compact(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	s := strings.TrimSpace(b.String())
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}
