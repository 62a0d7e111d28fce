package api

import (
	"net/http"
	"strings"
	"testing"
)

// The body cap follows the prompt cap: 3 bytes of JSON per prompt byte and
// 1 MiB for the rest, never below the 16 MiB the largest token_ids body
// needs, never above --http-max-body-bytes; gRPC's message cap likewise,
// without the HTTP flag.
func TestBodyCapFollowsPromptCap(t *testing.T) {
	for _, c := range []struct {
		maxBody   int64
		maxPrompt int
		want      int64
		wantGRPC  int
	}{
		{64 << 20, 8 << 20, 25 << 20, 25 << 20},
		{64 << 20, 1 << 10, 16 << 20, 16 << 20},
		{1000, 8 << 20, 1000, 25 << 20},
		{0, 0, maxBodyBytes, maxBodyBytes},
		{64 << 20, 100 << 20, 64 << 20, 64 << 20},
	} {
		s := &Server{cfg: Config{MaxBodyBytes: c.maxBody, MaxPromptBytes: c.maxPrompt}}
		if got := s.bodyCap(); got != c.want {
			t.Errorf("max body %d, max prompt %d: cap %d, want %d", c.maxBody, c.maxPrompt, got, c.want)
		}
		if got := s.GRPCMaxRecvMsgSize(); got != c.wantGRPC {
			t.Errorf("max prompt %d: gRPC cap %d, want %d", c.maxPrompt, got, c.wantGRPC)
		}
	}
}

// A small body of known length takes nothing from the budget; a larger one
// its length; a chunked one the cap.
func TestBodyReserve(t *testing.T) {
	req := func(n int64) *http.Request {
		r, _ := http.NewRequest("POST", "/v1/score", strings.NewReader("x"))
		r.ContentLength = n
		return r
	}
	for _, c := range []struct{ cl, want int64 }{{0, 0}, {1 << 20, 0}, {1<<20 + 1, 1<<20 + 1}, {-1, 777}} {
		if got := bodyReserve(req(c.cl), 777); got != c.want {
			t.Errorf("Content-Length %d: reserve %d, want %d", c.cl, got, c.want)
		}
	}
}
