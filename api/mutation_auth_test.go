package api

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// These tests pin the exact edges of the access guard, the token file and
// the endpoint policy that the gremlins run of issue 16 showed untested:
// each fails on the named mutant (applied by hand, see EQUIVALENT.md).

// A token of exactly MinTokenLen characters is accepted and one character
// less is refused (kills `len(f[0]) < MinTokenLen` -> `<=`).
func TestTokenMinLengthEdge(t *testing.T) {
	exact := strings.Repeat("k", MinTokenLen)
	tok, err := LoadTokens(writeTokens(t, exact+" read\n"), nil)
	if err != nil {
		t.Fatalf("token of exactly %d characters refused: %v", MinTokenLen, err)
	}
	if tok.Check(exact) != ScopeRead {
		t.Fatalf("token of exactly %d characters does not authenticate", MinTokenLen)
	}
	if _, err := LoadTokens(writeTokens(t, exact[1:]+" read\n"), nil); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Fatalf("token of %d characters: %v, want shorter-than error", MinTokenLen-1, err)
	}
}

// A token file error names the line it is on, counting blank and comment
// lines, so an operator can find it without the token being echoed (kills
// the line counter `n++` -> `n--`).
func TestTokenFileErrorNamesTheLine(t *testing.T) {
	content := "# comment\n\n" + readToken + " read\n" + adminToken + " superuser\n"
	_, err := LoadTokens(writeTokens(t, content), nil)
	if err == nil || !strings.Contains(err.Error(), "line 4:") {
		t.Fatalf("bad scope on line 4: %v, want an error naming line 4", err)
	}
}

// LoadTokens keeps the logger it is given (reload failures are reported
// there) and uses a working one when given nil (kills `log == nil` -> `!=`,
// which would drop the caller's logger and keep a nil one).
func TestLoadTokensKeepsTheLogger(t *testing.T) {
	var buf bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&buf, nil))
	p := writeTokens(t, readToken+" read\n")
	tok, err := LoadTokens(p, lg)
	if err != nil {
		t.Fatal(err)
	}
	if tok.log != lg {
		t.Error("LoadTokens replaced the logger it was given")
	}
	tok, err = LoadTokens(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok.log == nil {
		t.Fatal("LoadTokens(nil logger) keeps a nil logger: a failed reload would panic")
	}
	tok.log.Error("must not panic")
}

// Ports 1 and 65535 are valid, 0 and 65536 are not (kills `n < 1` -> `<= 1`
// and `n > 65535` -> `>= 65535`).
func TestEndpointPortEdges(t *testing.T) {
	for addr, ok := range map[string]bool{
		"tcp://10.0.0.7:1":     true,
		"tcp://10.0.0.7:65535": true,
		"tcp://10.0.0.7:0":     false,
		"tcp://10.0.0.7:65536": false,
		"tcp://10.0.0.7:-1":    false,
	} {
		if err := DefaultEndpointPolicy.Check(context.Background(), addr); (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", addr, err, ok)
		}
	}
}

// A body of exactly MaxBodyBytes is served, one byte more is refused before
// the handler runs (kills `r.ContentLength > max` -> `>=`).
func TestMaxBodyBytesEdge(t *testing.T) {
	score := `{"model":"m","token_ids":[1,2,3,4]}`
	limit := int64(len(score) + 8)
	g := newGuarded(t, Config{MaxBodyBytes: limit})
	exact := score + strings.Repeat(" ", int(limit)-len(score))
	if code, _, body := g.do(t, "POST", "/v1/score", "", "", exact); code != http.StatusOK {
		t.Errorf("body of exactly the limit (%d bytes): %d %s, want 200", limit, code, body)
	}
	if code, _, body := g.do(t, "POST", "/v1/score", "", "", exact+" "); code == http.StatusOK || !strings.Contains(body, "above the limit") {
		t.Errorf("body one byte above the limit: %d %s, want refused as above the limit", code, body)
	}
}
