package main

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// The status page test loads GET / in a real headless Chromium (Debian's
// chromium; hack/test-deps.sh installs it) against a daemon with a published
// fleet, lets the page's JavaScript run, and checks the DOM it built and a
// screenshot. It skips loudly without chromium and fails under CI=true.

func requireChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "!!! STATUS PAGE BROWSER TEST NOT RUN: no chromium in PATH (apt-get install -y chromium, or run hack/test-deps.sh)"
	if ci := strings.ToLower(os.Getenv("CI")); ci != "" && ci != "0" && ci != "false" {
		t.Fatal(msg)
	}
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
	return ""
}

// headless runs chromium once on url with extra flags (--dump-dom or
// --screenshot) and returns its stdout. --virtual-time-budget lets the page
// run its fetches and timers before the dump; a fresh profile directory
// keeps runs independent.
func headless(t *testing.T, chromium, pageURL string, extra ...string) []byte {
	t.Helper()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=15000", "--window-size=1280,1500", "--hide-scrollbars"}
	args = append(args, extra...)
	args = append(args, pageURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(extra, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

var (
	podRowTag = regexp.MustCompile(`<tr[^>]*\bdata-pod="([^"]+)"[^>]*\bdata-dp-rank="(\d+)"`)
	barTag    = regexp.MustCompile(`<div[^>]*\bclass="bar"[^>]*>`)
	attr      = regexp.MustCompile(`\b(data-pod|data-matched)="([^"]*)"`)
)

func TestStatusPageInBrowser(t *testing.T) {
	chromium := requireChromium(t)
	e, ids := startFleetDaemon(t)
	total := len(ids) / e2eBlock
	// The page scores the request a link carries on load, as if the form
	// had been submitted.
	pageURL := e.base + "/?" + url.Values{"model": {fleetModel}, "prompt": {fleetPrompt}}.Encode()

	dom := string(headless(t, chromium, pageURL, "--dump-dom"))
	var rows []string
	for _, m := range podRowTag.FindAllStringSubmatch(dom, -1) {
		rows = append(rows, m[1]+"/"+m[2])
	}
	sort.Strings(rows)
	wantRows := "10.0.0.1:8000/0 10.0.0.2:8000/0 10.0.0.3:8000/0 10.0.0.3:8000/1 10.0.0.4:8000/0"
	if got := strings.Join(rows, " "); got != wantRows {
		t.Fatalf("pod rows: %q, want %q\nDOM:\n%s", got, wantRows, dom)
	}
	var bars []string
	for _, tag := range barTag.FindAllString(dom, -1) {
		a := map[string]string{}
		for _, m := range attr.FindAllStringSubmatch(tag, -1) {
			a[m[1]] = m[2]
		}
		bars = append(bars, a["data-pod"]+"="+a["data-matched"])
	}
	// Best first: the whole prompt on GPU, half on CPU, DP rank 1's three
	// blocks, one disk block.
	wantBars := fmt.Sprintf("10.0.0.1:8000=%d 10.0.0.2:8000=%d 10.0.0.3:8000=3 10.0.0.4:8000=1", total, total/2)
	if got := strings.Join(bars, " "); got != wantBars {
		t.Fatalf("score bars: %q, want %q\nDOM:\n%s", got, wantBars, dom)
	}
	if !strings.Contains(dom, fmt.Sprintf("%d full blocks in the request", total)) || !strings.Contains(dom, ">ready<") {
		t.Fatalf("summary or readiness missing from the page:\n%s", dom)
	}
	requireAxes(t, dom)

	shot, img := screenshot(t, chromium, pageURL, "status-page.png")
	// The GPU segments of the bars (#2f6fdb) must be on screen, not just in
	// the DOM.
	if n := countColor(img, 0x2f, 0x6f, 0xdb); n < 500 {
		t.Fatalf("screenshot %s shows %d pixels of the GPU bar colour", shot, n)
	}
	t.Logf("status page screenshot: %s (set KVINDEX_TEST_ARTIFACTS to keep it)", shot)
}

// screenshot renders url in headless chromium to name under artifacts and
// decodes it.
func screenshot(t *testing.T, chromium, url, name string) (string, image.Image) {
	t.Helper()
	shot := filepath.Join(artifacts(t), name)
	headless(t, chromium, url, "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	return shot, img
}

// artifacts is where screenshots go: $KVINDEX_TEST_ARTIFACTS to keep them.
func artifacts(t *testing.T) string {
	dir := os.Getenv("KVINDEX_TEST_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

var (
	axisLabel   = regexp.MustCompile(`<text[^>]*\bdata-axis="([xy])"[^>]*>([^<]*)</text>`)
	chartMsg    = regexp.MustCompile(`<text[^>]*\bid="chartmsg"[^>]*>([^<]*)</text>`)
	loginHidden = regexp.MustCompile(`<section[^>]*\bid="loginsection"[^>]*\bhidden`)
)

// requireAxes fails unless the activity chart has its time axis (five
// minutes to now) and a rate axis from 0.
func requireAxes(t *testing.T, dom string) {
	t.Helper()
	var x, y []string
	for _, m := range axisLabel.FindAllStringSubmatch(dom, -1) {
		if m[1] == "x" {
			x = append(x, m[2])
		} else {
			y = append(y, m[2])
		}
	}
	if got := strings.Join(x, " "); got != "-5 min -4 min -3 min -2 min -1 min now" {
		t.Fatalf("chart time axis: %q\nDOM:\n%s", got, dom)
	}
	if len(y) != 5 || y[0] != "0/s" {
		t.Fatalf("chart rate axis: %q\nDOM:\n%s", y, dom)
	}
}

// With --auth-token-file the page still opens in a browser (it holds no
// data), shows its axes and asks for a token; every data call still needs
// the token, which the page sends as a bearer header once given (here in
// the link's fragment, which never reaches the server).
func TestStatusPageWithToken(t *testing.T) {
	chromium := requireChromium(t)
	const token = "status-page-read-token-0123"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(token+" read\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startInProcess(t, func(c *Config) { c.AuthTokenFile = tokens })
	for _, path := range []string{"/v1/status", "/v1/pods", "/v1/models"} {
		resp, err := http.Get(e.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("GET %s without a token: %d, want 401", path, resp.StatusCode)
		}
	}

	dom := string(headless(t, chromium, e.base+"/", "--dump-dom"))
	requireAxes(t, dom)
	if loginHidden.MatchString(dom) || !strings.Contains(dom, ">token required<") {
		t.Fatalf("without a token the page does not ask for one:\n%s", dom)
	}
	if m := chartMsg.FindStringSubmatch(dom); m == nil || !strings.Contains(m[1], "enter a token") {
		t.Fatalf("the empty chart does not say why it is empty: %q\nDOM:\n%s", m, dom)
	}

	dom = string(headless(t, chromium, e.base+"/#token=not-the-token-0123456789", "--dump-dom"))
	if loginHidden.MatchString(dom) || !strings.Contains(dom, "the daemon rejected this token") {
		t.Fatalf("a wrong token is not reported:\n%s", dom)
	}

	dom = string(headless(t, chromium, e.base+"/#token="+token, "--dump-dom"))
	if !loginHidden.MatchString(dom) || !strings.Contains(dom, ">ready<") || !strings.Contains(dom, "events applied") {
		t.Fatalf("with the token the page does not show the daemon's status:\n%s", dom)
	}
	requireAxes(t, dom)
	if strings.Contains(dom, token) {
		t.Fatal("the token is left in the page")
	}

	// The screenshot shows the axes of the empty chart (crisp 1px lines in
	// the muted colour #6b7385), not a blank box.
	shot := filepath.Join(artifacts(t), "status-page-token.png")
	headless(t, chromium, e.base+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if n := countColor(img, 0x6b, 0x73, 0x85); n < 1000 {
		t.Fatalf("screenshot %s shows %d pixels of the chart's axis colour", shot, n)
	}
}

func countColor(img image.Image, r, g, b uint8) int {
	n := 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if uint8(cr>>8) == r && uint8(cg>>8) == g && uint8(cb>>8) == b {
				n++
			}
		}
	}
	return n
}
