package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// post sends one JSON body and decodes the answer into out.
func postJSON(t *testing.T, url, body string, out any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

var (
	qualityModelTag = regexp.MustCompile(`<div[^>]*\bclass="qmodel"[^>]*\bdata-quality-model="([^"]+)"`)
	qualityPodRow   = regexp.MustCompile(`<tr[^>]*\bdata-quality-pod="([^"]+)"[^>]*\bdata-alarm="(true|false)"`)
	qualityTiers    = regexp.MustCompile(`\bdata-tiers="([^"]*)"`)
	qualitySummary  = regexp.MustCompile(`<p[^>]*\bclass="mut qsummary"[^>]*>([^<]*)</p>`)
	shareRect       = regexp.MustCompile(`<rect[^>]*\bclass="share"[^>]*\bdata-share="([0-9.]+)"`)
	pressureRect    = regexp.MustCompile(`<rect[^>]*\bclass="pressure"[^>]*\bdata-pressure="(\d+)"`)
)

// Issue 36: the status page's per-model routing view, in a real browser.
// A router's picks (one sent off the warm pod by load, to a pod holding
// nothing) and an engine whose feedback disagrees with the index must show
// as the model's summary, its history chart (cached share and pressure
// bars, drawn on screen), the picked pods with their tiers and role column,
// and the drift alarm.
func TestStatusPageRoutingQualityInBrowser(t *testing.T) {
	chromium := requireChromium(t)
	e, ids := startFleetDaemon(t)
	tokens, _ := json.Marshal(ids)
	pick := func(cands, policy string) (pod, id string) {
		var a struct {
			Pod    string `json:"pod"`
			PickID string `json:"pick_id"`
		}
		postJSON(t, e.base+"/v1/pick", `{"model":"`+fleetModel+`","token_ids":`+string(tokens)+`,"policy":"`+policy+`","candidates":`+cands+`}`, &a)
		return a.Pod, a.PickID
	}
	// The warm pod holds the whole prompt on GPU; its engine reports no
	// cache hits at all (it lost its cache without telling): 16 of 16
	// feedbacks disagree.
	total := len(ids) / e2eBlock
	for range 16 {
		pod, id := pick(`[{"pod":"10.0.0.1:8000"},{"pod":"10.0.0.2:8000"}]`, "")
		if pod != "10.0.0.1:8000" {
			t.Fatalf("picked %s", pod)
		}
		var fb struct {
			Disagrees bool `json:"disagrees"`
		}
		postJSON(t, e.base+"/v1/feedback", fmt.Sprintf(`{"pick_id":%q,"cached_tokens":0,"prompt_tokens":%d}`, id, len(ids)), &fb)
		if !fb.Disagrees {
			t.Fatal("feedback of 0 cached tokens agrees with a fully cached pod")
		}
	}
	// Load sends one request away from the warm pod to one holding nothing.
	if pod, _ := pick(`[{"pod":"10.0.0.1:8000","running":50},{"pod":"10.0.0.9:8000","events":true}]`, "cost"); pod != "10.0.0.9:8000" {
		t.Fatalf("the loaded warm pod kept the request: %s", pod)
	}

	dom := string(headless(t, chromium, e.base+"/", "--dump-dom"))
	if m := qualityModelTag.FindAllStringSubmatch(dom, -1); len(m) != 1 || m[0][1] != fleetModel {
		t.Fatalf("model cards %q, want one for %s\nDOM:\n%s", m, fleetModel, dom)
	}
	sum := qualitySummary.FindStringSubmatch(dom)
	if sum == nil || !strings.Contains(sum[1], "17 picks") || !strings.Contains(sum[1], "affinity pressure 1") || !strings.Contains(sum[1], "cold picks 1") {
		t.Fatalf("model summary %q\nDOM:\n%s", sum, dom)
	}
	rows := map[string]string{}
	for _, m := range qualityPodRow.FindAllStringSubmatch(dom, -1) {
		rows[m[1]] = m[2]
	}
	if len(rows) != 2 || rows["10.0.0.1:8000"] != "true" || rows["10.0.0.9:8000"] != "false" {
		t.Fatalf("picked pods and their alarms: %v\nDOM:\n%s", rows, dom)
	}
	if tiers := qualityTiers.FindStringSubmatch(dom); tiers == nil || tiers[1] != fmt.Sprintf("gpu:%d", 16*total) {
		t.Fatalf("the warm pod's tiers: %q, want gpu:%d", tiers, 16*total)
	}
	if !strings.Contains(dom, ">role</th>") || !strings.Contains(dom, ">drift</span>") {
		t.Fatalf("the pod table lacks its role column or the drift badge\nDOM:\n%s", dom)
	}
	if s := shareRect.FindAllStringSubmatch(dom, -1); len(s) == 0 {
		t.Fatalf("no cached-share bars in the chart\nDOM:\n%s", dom)
	}
	if p := pressureRect.FindAllStringSubmatch(dom, -1); len(p) == 0 {
		t.Fatalf("no affinity-pressure bar in the chart\nDOM:\n%s", dom)
	}

	shot, img := screenshot(t, chromium, e.base+"/", "status-page-quality.png")
	// The share bars (#7b3fe4) and the pressure bar (#d6336c) are on
	// screen, not only in the DOM.
	if n := countColor(img, 0x7b, 0x3f, 0xe4); n < 300 {
		t.Fatalf("screenshot %s shows %d pixels of the cached-share colour", shot, n)
	}
	if n := countColor(img, 0xd6, 0x33, 0x6c); n < 20 {
		t.Fatalf("screenshot %s shows %d pixels of the pressure colour", shot, n)
	}
	t.Logf("routing quality screenshot: %s (set KVINDEX_TEST_ARTIFACTS to keep it)", shot)
}
