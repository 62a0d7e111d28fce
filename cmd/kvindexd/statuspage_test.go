package main

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
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

	dir := os.Getenv("KVINDEX_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status-page.png")
	headless(t, chromium, pageURL, "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	// The GPU segments of the bars (#2f6fdb) must be on screen, not just in
	// the DOM.
	if n := countColor(img, 0x2f, 0x6f, 0xdb); n < 500 {
		t.Fatalf("screenshot %s shows %d pixels of the GPU bar colour", shot, n)
	}
	t.Logf("status page screenshot: %s (set KVINDEX_TEST_ARTIFACTS to keep it)", shot)
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
