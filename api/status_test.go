package api

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/kvevents/event"
)

func TestStatusPageIsSelfContained(t *testing.T) {
	st := newStack(t)
	resp, err := http.Get(st.http.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	page := string(body)
	for _, want := range []string{`id="pods"`, `id="scoreform"`, `id="chart"`, "/v1/status", "/v1/pods", "/v1/score"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	// No external assets: nothing is loaded from another origin.
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|<link|@import|url\(`).FindString(page); m != "" {
		t.Errorf("the page references an external asset: %q", m)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	// Only / itself: other paths are not the page.
	if r, _ := http.Get(st.http.URL + "/index.html"); r.StatusCode != http.StatusNotFound {
		t.Errorf("GET /index.html: %d", r.StatusCode)
	}
}

func TestStatusCounters(t *testing.T) {
	st := newStack(t)
	get := func() Status {
		t.Helper()
		resp, err := http.Get(st.http.URL + "/v1/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s Status
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s0 := get()
	if !s0.Ready || s0.Time <= 0 || s0.ScoreRequests != 0 || s0.EventsApplied != 0 {
		t.Fatalf("fresh status: %+v", s0)
	}
	prompt := seqTokens(1, 4*testBlock)
	st.store("pod-a", 0, event.TierGPU, prompt, 4, blockkeys.RequestExtras{})
	st.store("pod-b", 0, event.TierGPU, prompt, 2, blockkeys.RequestExtras{})
	ids, _ := json.Marshal(prompt)
	for range 3 {
		st.scoreHTTP(`{"model":"` + testModel + `","token_ids":` + string(ids) + `}`)
	}
	st.post("/v1/score", `{}`) // failures count as requests too
	s1 := get()
	if s1.EventsApplied != 2 || s1.ScoreRequests != 4 || s1.Time < s0.Time {
		t.Fatalf("status after 2 events and 4 requests: %+v", s1)
	}
}

// The binary's version reaches both /v1/status and the
// kvindexd_build_info gauge from Config.Build.
func TestStatusAndMetricsCarryBuildInfo(t *testing.T) {
	b := BuildInfo{Version: "v1.2.3", Commit: "0123abc", GoVersion: "go1.99"}
	st := newStackWith(t, indexer.Config{Keys: testKeys}, func(c *Config) { c.Build = b })
	resp, err := http.Get(st.http.URL + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var s Status
	err = json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	if err != nil || s.Build != b {
		t.Fatalf("status build = %+v (%v), want %+v", s.Build, err, b)
	}
	resp, err = http.Get(st.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `kvindexd_build_info{commit="0123abc",go_version="go1.99",version="v1.2.3"} 1`; !strings.Contains(string(body), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}
