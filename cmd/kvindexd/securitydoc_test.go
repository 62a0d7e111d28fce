package main

import (
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docs/security.md states each limit's default beside the flag that sets it,
// so that the bounds can be reasoned about in one place; the flag set is
// the source of those defaults (configuration.md is generated from it). A
// default that changes in the code without the manual fails here.
func TestSecurityDocDefaultsAreTheFlags(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := serveFlags()
	flagRe := regexp.MustCompile("`--([a-z0-9-]+)`")
	checked := 0
	var header []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "|") {
			header = nil
			continue
		}
		cells := tableCells(line)
		if header == nil {
			header = cells
			continue
		}
		if strings.HasPrefix(cells[0], "---") {
			continue
		}
		def, flagCol := -1, 0
		for i, h := range header {
			switch strings.ToLower(h) {
			case "default":
				def = i
			case "flag":
				flagCol = i
			}
		}
		if def < 0 || def >= len(cells) || flagCol >= len(cells) {
			continue
		}
		m := flagRe.FindStringSubmatch(cells[flagCol])
		if m == nil {
			continue
		}
		f := fs.Lookup(m[1])
		if f == nil {
			t.Errorf("docs/security.md names --%s, which serve does not have: %s", m[1], line)
			continue
		}
		if strings.Contains(cells[def], m[0]) {
			continue // a budget derived from the flag, not its default
		}
		if !sameDefault(cells[def], f) {
			t.Errorf("docs/security.md: --%s's default is %q there, %q in the flag set", m[1], cells[def], f.DefValue)
		}
		checked++
	}
	if checked < 20 {
		t.Fatalf("only %d flag defaults found in docs/security.md's tables: has the table format changed?", checked)
	}
}

func tableCells(line string) []string {
	parts := strings.Split(strings.Trim(line, "|"), "|")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// docQuantity is the first quantity of a default as the manual writes it:
// "`5s`", "65536", "33554432 (32 MiB)", "8 MiB (...)", "expire after 1 h".
var docQuantity = regexp.MustCompile(`\d[\d,.]*(?: ?(?:KiB|MiB|GiB|ms|s|m|h)\b)?`)

// sameDefault compares a default as the manual writes it with the flag's.
func sameDefault(cell string, f *flag.Flag) bool {
	v := cell
	for _, sep := range []string{" (", ": "} {
		if i := strings.Index(v, sep); i >= 0 {
			v = v[:i]
		}
	}
	if strings.Trim(strings.TrimSpace(v), "`") == f.DefValue {
		return true
	}
	q := docQuantity.FindString(cell)
	if q == "" {
		return false
	}
	q = strings.ReplaceAll(q, ",", "")
	if n, unit, ok := strings.Cut(q, " "); ok && !strings.HasSuffix(unit, "iB") {
		q = n + unit // "5 s" -> "5s"
	}
	a, ok := docNumber(q)
	b, ok2 := docNumber(f.DefValue)
	return ok && ok2 && a == b
}

// docNumber reads a count, a size with a binary unit or a duration as a
// float (durations in nanoseconds).
func docNumber(s string) (float64, bool) {
	for unit, mult := range map[string]float64{" KiB": 1 << 10, " MiB": 1 << 20, " GiB": 1 << 30} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			x, err := strconv.ParseFloat(n, 64)
			return x * mult, err == nil
		}
	}
	if x, err := strconv.ParseFloat(s, 64); err == nil {
		return x, true
	}
	if d, err := time.ParseDuration(s); err == nil {
		return float64(d), true
	}
	return 0, false
}
